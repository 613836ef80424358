//! Binary retrieval metrics of one query's ranked list of levels.
//!
//! The positives are the items whose level is at least `min_level` (`min_level ≥ 1`):
//! `min_level = 1` gives "any shared ancestor", `min_level = L` the same fine class, and
//! `min_level = l` the per-level positives `Ω^{+,l}` of HAPPIER Eq. (13) / supp. B.3.
//!
//! Every function returns `None` when the list holds no positive (a "lone" query: the caller
//! skips it and counts it) and when `min_level = 0`, which would make the negatives positives.
//! Positions are 1-based in the formulas below (`rank(k)` of the item at 0-based index `i` is
//! `i + 1`).

use super::{levels_up_to, RankedLevels};

/// One ranked list seen as a binary problem (positives: level `≥ min_level`), its positives
/// counted once: the evaluation engine scores about twenty binary metrics of every row, and
/// counting the positives of a 60k-item list again for each of them was a large part of a
/// SOP-scale evaluation. The free functions below are this type's methods on a list of their
/// own.
///
/// ```
/// use rankwise::metrics::Binary;
/// // Positives (level ≥ 1) at ranks 2 and 5.
/// let list = Binary::new(&[0, 2, 0, 0, 1], 1).unwrap();
/// assert!((list.average_precision() - 0.45).abs() < 1e-15);
/// assert_eq!(list.map_at_r(), 0.25);
/// assert_eq!(list.recall_at_k(1), 0.0);
/// assert!(Binary::new(&[0, 0], 1).is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Binary<'a, L: RankedLevels + ?Sized = [u8]> {
    ranked: &'a L,
    min_level: u8,
    positives: usize,
}

impl<'a> Binary<'a, [u8]> {
    /// `None` if the list holds no positive or `min_level` is 0 (which would make the negatives
    /// positives).
    pub fn new(ranked: &'a [u8], min_level: u8) -> Option<Self> {
        Binary::on(ranked, min_level)
    }
}

impl<'a, L: RankedLevels + ?Sized> Binary<'a, L> {
    /// [`Binary::new`] for any view of a ranked list ([`RankedLevels`]), e.g. the engine's
    /// [`super::Positives`].
    pub fn on(ranked: &'a L, min_level: u8) -> Option<Self> {
        if min_level == 0 {
            return None;
        }
        let positives = ranked.positives().filter(|&(_, l)| l >= min_level).count();
        Self::with_positives(ranked, min_level, positives)
    }

    /// [`Binary::on`] with the positives read from `counts`, the number of items of each
    /// level of `ranked` ([`crate::hierarchy::level_counts`]).
    pub(crate) fn from_counts(ranked: &'a L, min_level: u8, counts: &[usize]) -> Option<Self> {
        if min_level == 0 {
            return None;
        }
        let positives = counts.iter().skip(min_level as usize).sum::<usize>();
        debug_assert_eq!(
            positives,
            ranked.positives().filter(|&(_, l)| l >= min_level).count()
        );
        Self::with_positives(ranked, min_level, positives)
    }

    fn with_positives(ranked: &'a L, min_level: u8, positives: usize) -> Option<Self> {
        (min_level > 0 && positives > 0).then_some(Binary {
            ranked,
            min_level,
            positives,
        })
    }

    /// Positions of this problem's positives (level `≥ min_level`), increasing.
    fn hit_positions(&self) -> impl Iterator<Item = usize> + '_ {
        let m = self.min_level;
        self.ranked
            .positives()
            .filter(move |&(_, l)| l >= m)
            .map(|(i, _)| i)
    }

    /// See [`average_precision`]. The scan stops at the last positive: the rest adds nothing.
    pub fn average_precision(&self) -> f64 {
        let mut hits = 0usize;
        let mut sum = 0.0;
        for i in self.hit_positions() {
            hits += 1;
            sum += hits as f64 / (i + 1) as f64;
            if hits == self.positives {
                break;
            }
        }
        sum / hits as f64
    }

    /// See [`map_at_r`].
    pub fn map_at_r(&self) -> f64 {
        // Σ P(i) at the positives among the first R positions (R = the number of positives).
        let r = self.positives;
        let mut sum = 0.0;
        for (hits, i) in self.hit_positions().take_while(|&i| i < r).enumerate() {
            sum += (hits + 1) as f64 / (i + 1) as f64;
        }
        sum / r as f64
    }

    /// See [`r_precision`].
    pub fn r_precision(&self) -> f64 {
        let r = self.positives;
        self.hits(r) as f64 / r as f64
    }

    /// See [`recall_at_k`].
    pub fn recall_at_k(&self, k: usize) -> f64 {
        let top = k.min(self.ranked.list_len());
        if self.hit_positions().next().is_some_and(|i| i < top) {
            1.0
        } else {
            0.0
        }
    }

    /// See [`precision_at_k`]; `None` if `k = 0`.
    pub fn precision_at_k(&self, k: usize) -> Option<f64> {
        (k > 0).then(|| self.hits(k) as f64 / k as f64)
    }

    /// See [`binary_asi`].
    pub fn asi(&self) -> f64 {
        // Σ P(i) at every one of the first R positions. `R ≤ len` because the positives are
        // counted in the list itself.
        let r = self.positives;
        let m = self.min_level;
        let mut hits = 0usize;
        let mut sum = 0.0;
        for (i, level) in levels_up_to(self.ranked.positives(), r).enumerate() {
            hits += usize::from(level >= m);
            sum += hits as f64 / (i + 1) as f64;
        }
        sum / r as f64
    }

    /// Positives among the first `k` items (all items when `k > n`).
    fn hits(&self, k: usize) -> usize {
        let top = k.min(self.ranked.list_len());
        self.hit_positions().take_while(|&i| i < top).count()
    }
}

/// Binary average precision, HAPPIER Eq. (1):
/// `AP = 1/|Ω⁺| · Σ_{k ∈ Ω⁺} rank⁺(k) / rank(k)`, where `rank⁺(k)` counts the positives up to and
/// including `k`. With `min_level = l` this is the per-level `AP^(l)` of HAPPIER Eq. (13) (all
/// items of level `≥ l` are positives), the "Coarse AP"/"Fine AP" of its tables.
///
/// Equal to the authors' `metrics.ap` and to pytorch-metric-learning's `mean_average_precision`
/// for one query. `None` if the list has no positive or `min_level = 0`.
///
/// ```
/// use rankwise::metrics::average_precision;
/// // Levels of the ranked items; positives are the items of level ≥ 1, here at ranks 2 and 5.
/// let ap = average_precision(&[0, 2, 0, 0, 1], 1).unwrap();
/// assert!((ap - (1.0 / 2.0 + 2.0 / 5.0) / 2.0).abs() < 1e-15); // 0.45
/// // Only the level-2 item is a positive at min_level = 2 (a per-level AP of HAPPIER Eq. 13).
/// assert_eq!(average_precision(&[0, 2, 0, 0, 1], 2), Some(0.5));
/// assert_eq!(average_precision(&[0, 0], 1), None); // no positive
/// ```
pub fn average_precision(ranked: &[u8], min_level: u8) -> Option<f64> {
    Binary::new(ranked, min_level).map(|b| b.average_precision())
}

/// mAP@R of Musgrave et al. (pytorch-metric-learning `mean_average_precision_at_r` for one
/// query; SSR Table 1): `mAP@R = 1/R · Σ_{i=1..R} P(i) · 1[item i is a positive]`, with `R` the
/// number of positives in the list and `P(i)` the precision at `i`.
///
/// That is AP truncated to the first `R` positions but still divided by `R`, so a positive
/// ranked beyond `R` contributes nothing. Equal to the authors' `metrics.map_at_R`. `None` if the
/// list has no positive or `min_level = 0`.
///
/// ```
/// use rankwise::metrics::map_at_r;
/// // R = 2 positives, at ranks 2 and 5: only the one within the first R counts, P(2) = 1/2.
/// assert_eq!(map_at_r(&[0, 2, 0, 0, 1], 1), Some(0.25));
/// assert_eq!(map_at_r(&[1, 1, 0], 1), Some(1.0));
/// ```
pub fn map_at_r(ranked: &[u8], min_level: u8) -> Option<f64> {
    Binary::new(ranked, min_level).map(|b| b.map_at_r())
}

/// R-precision (pytorch-metric-learning `r_precision`): the fraction of positives among the first
/// `R` items, `R` = the number of positives in the list. `None` if there is no positive or
/// `min_level = 0`.
///
/// ```
/// use rankwise::metrics::r_precision;
/// // R = 2 positives; one of them in the first 2 items.
/// assert_eq!(r_precision(&[0, 2, 0, 0, 1], 1), Some(0.5));
/// ```
pub fn r_precision(ranked: &[u8], min_level: u8) -> Option<f64> {
    Binary::new(ranked, min_level).map(|b| b.r_precision())
}

/// The metric-learning "R@k" (recall *rate*, HAPPIER Tables 2–4, Smooth-AP Tables 2–3): 1 if at
/// least one positive is among the first `k` items, else 0 — the authors' `recall_rate_at_k`
/// (`sorted_target[:, :k].any(1)`). Not the IR recall (fraction of positives retrieved).
///
/// `k = 0` gives 0 (no item retrieved); `k > n` looks at the whole list, so it is 1 whenever the
/// list has a positive. `None` if the list has no positive or `min_level = 0`.
///
/// ```
/// use rankwise::metrics::recall_at_k;
/// let ranked = [0, 2, 0, 0, 1];
/// assert_eq!(recall_at_k(&ranked, 1, 1), Some(0.0)); // no positive at rank 1
/// assert_eq!(recall_at_k(&ranked, 1, 2), Some(1.0)); // one in the first 2
/// ```
pub fn recall_at_k(ranked: &[u8], min_level: u8, k: usize) -> Option<f64> {
    Binary::new(ranked, min_level).map(|b| b.recall_at_k(k))
}

/// Precision at `k`: the number of positives among the first `k` items divided by `k`
/// (`P@1` of HAPPIER's code, `precision_at_1` of pytorch-metric-learning).
///
/// When `k > n` the missing positions count as non-relevant and the denominator stays `k` (the
/// standard IR definition). The authors' code (`sorted_target[:, :k].mean(-1)`) would divide by
/// `min(k, n)` instead; the two agree whenever `k ≤ n`, which the full-ranking evaluation always
/// satisfies for the `k` it uses (1). `None` if `k = 0` (precision at 0 is 0/0), if the list has
/// no positive, or if `min_level = 0`.
///
/// ```
/// use rankwise::metrics::precision_at_k;
/// assert_eq!(precision_at_k(&[0, 2, 0, 0, 1], 1, 5), Some(0.4));
/// assert_eq!(precision_at_k(&[0, 2, 0, 0, 1], 1, 0), None); // 0/0
/// ```
pub fn precision_at_k(ranked: &[u8], min_level: u8, k: usize) -> Option<f64> {
    Binary::new(ranked, min_level).and_then(|b| b.precision_at_k(k))
}

/// Binary Average Set Intersection (HAPPIER supp. B.3 for DyML, the authors' `asi` on a binary
/// target, `with_binary_asi`): `ASI = 1/R · Σ_{n=1..R} |{a_1..a_n} ∩ {b_1..b_n}| / n`, with `b` the
/// ideal list (all `R` positives first). For `n ≤ R` the intersection is the number of
/// positives among the first `n` items, so this is the mean of `P@n` for `n = 1..R`.
///
/// Equal to [`asi`](crate::metrics::asi()) on the list with levels `≥ min_level` mapped to 1 and the
/// others to 0. `None` if the list has no positive or `min_level = 0`.
///
/// ```
/// use rankwise::metrics::binary_asi;
/// // R = 2: the mean of P@1 = 0 and P@2 = 1/2.
/// assert_eq!(binary_asi(&[0, 2, 0, 0, 1], 1), Some(0.25));
/// ```
pub fn binary_asi(ranked: &[u8], min_level: u8) -> Option<f64> {
    Binary::new(ranked, min_level).map(|b| b.asi())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-15)
    }

    #[test]
    fn ap_by_hand() {
        // Positives (level ≥ 1) at ranks 2 and 5: (1/2 + 2/5) / 2 = 0.45.
        let ranked = [0, 2, 0, 0, 1];
        assert!(close(average_precision(&ranked, 1), 0.45));
        // Only the level-2 item is positive at min_level 2: 1/2.
        assert!(close(average_precision(&ranked, 2), 0.5));
        assert!(close(average_precision(&[1, 1, 1], 1), 1.0));
    }

    #[test]
    fn map_at_r_truncates_but_divides_by_r() {
        // R = 2; only rank 2 is within the first R: (1/2) / 2.
        assert!(close(map_at_r(&[0, 2, 0, 0, 1], 1), 0.25));
        assert!(close(r_precision(&[0, 2, 0, 0, 1], 1), 0.5));
        assert!(close(map_at_r(&[1, 1, 0], 1), 1.0));
    }

    #[test]
    fn recall_and_precision_at_k() {
        let ranked = [0, 0, 3, 1];
        assert_eq!(recall_at_k(&ranked, 1, 2), Some(0.0));
        assert_eq!(recall_at_k(&ranked, 1, 3), Some(1.0));
        assert_eq!(recall_at_k(&ranked, 1, 0), Some(0.0));
        assert_eq!(recall_at_k(&ranked, 1, 100), Some(1.0));
        assert_eq!(recall_at_k(&ranked, 3, 3), Some(1.0));
        assert_eq!(precision_at_k(&ranked, 1, 4), Some(0.5));
        assert_eq!(precision_at_k(&ranked, 1, 3), Some(1.0 / 3.0));
        // k > n: the denominator stays k.
        assert_eq!(precision_at_k(&ranked, 1, 8), Some(0.25));
        assert_eq!(precision_at_k(&ranked, 1, 0), None);
    }

    #[test]
    fn binary_asi_is_the_mean_precision_up_to_r() {
        // R = 2: (P@1 + P@2) / 2 = (0 + 1/2) / 2.
        assert!(close(binary_asi(&[0, 2, 0, 0, 1], 1), 0.25));
        assert!(close(binary_asi(&[2, 2, 0], 1), 1.0));
    }

    #[test]
    fn counted_once_equals_each_function_on_its_own() {
        use crate::hierarchy::level_counts;
        for ranked in [
            &[0u8, 2, 0, 0, 1][..],
            &[2, 2, 0, 1, 0, 0, 2],
            &[0, 0, 0],
            &[1],
        ] {
            let counts = level_counts(ranked, 2);
            for min_level in 0..=2u8 {
                let b = Binary::from_counts(ranked, min_level, &counts);
                assert_eq!(b.is_some(), Binary::new(ranked, min_level).is_some());
                let at = |f: fn(&Binary) -> f64| b.as_ref().map(f);
                assert_eq!(
                    at(|b| b.average_precision()),
                    average_precision(ranked, min_level)
                );
                assert_eq!(at(|b| b.map_at_r()), map_at_r(ranked, min_level));
                assert_eq!(at(|b| b.r_precision()), r_precision(ranked, min_level));
                assert_eq!(at(|b| b.asi()), binary_asi(ranked, min_level));
                for k in [0, 1, 3, 10] {
                    let recall = b.as_ref().map(|b| b.recall_at_k(k));
                    assert_eq!(recall, recall_at_k(ranked, min_level, k));
                    let precision = b.as_ref().and_then(|b| b.precision_at_k(k));
                    assert_eq!(precision, precision_at_k(ranked, min_level, k));
                }
            }
        }
    }

    #[test]
    fn undefined_cases_are_none() {
        for f in [average_precision, map_at_r, r_precision, binary_asi] {
            assert_eq!(f(&[], 1), None);
            assert_eq!(f(&[0, 0], 1), None);
            assert_eq!(f(&[1, 0], 2), None);
            assert_eq!(f(&[1, 0], 0), None);
        }
        assert_eq!(recall_at_k(&[], 1, 1), None);
        assert_eq!(recall_at_k(&[0], 1, 1), None);
        assert_eq!(recall_at_k(&[1], 0, 1), None);
        assert_eq!(precision_at_k(&[0, 0], 1, 1), None);
        assert_eq!(precision_at_k(&[1], 0, 1), None);
    }
}

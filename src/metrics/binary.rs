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

/// Number of positives in `ranked`, or `None` if there is none or `min_level` is 0.
fn count_positives(ranked: &[u8], min_level: u8) -> Option<usize> {
    if min_level == 0 {
        return None;
    }
    let r = ranked.iter().filter(|&&l| l >= min_level).count();
    (r > 0).then_some(r)
}

/// Binary average precision, HAPPIER Eq. (1):
/// `AP = 1/|Ω⁺| · Σ_{k ∈ Ω⁺} rank⁺(k) / rank(k)`, where `rank⁺(k)` counts the positives up to and
/// including `k`. With `min_level = l` this is the per-level `AP^(l)` of HAPPIER Eq. (13) (all
/// items of level `≥ l` are positives), the "Coarse AP"/"Fine AP" of its tables.
///
/// Equal to the authors' `metrics.ap` and to pytorch-metric-learning's `mean_average_precision`
/// for one query. `None` if the list has no positive or `min_level = 0`.
pub fn average_precision(ranked: &[u8], min_level: u8) -> Option<f64> {
    if min_level == 0 {
        return None;
    }
    let mut hits = 0usize;
    let mut sum = 0.0;
    for (i, &level) in ranked.iter().enumerate() {
        if level >= min_level {
            hits += 1;
            sum += hits as f64 / (i + 1) as f64;
        }
    }
    (hits > 0).then(|| sum / hits as f64)
}

/// mAP@R of Musgrave et al. (pytorch-metric-learning `mean_average_precision_at_r` for one
/// query; SSR Table 1): `mAP@R = 1/R · Σ_{i=1..R} P(i) · 1[item i is a positive]`, with `R` the
/// number of positives in the list and `P(i)` the precision at `i`.
///
/// That is AP truncated to the first `R` positions but still divided by `R`, so a positive
/// ranked beyond `R` contributes nothing. Equal to the authors' `metrics.map_at_R`. `None` if the
/// list has no positive or `min_level = 0`.
pub fn map_at_r(ranked: &[u8], min_level: u8) -> Option<f64> {
    let r = count_positives(ranked, min_level)?;
    let mut hits = 0usize;
    let mut sum = 0.0;
    // `r ≤ ranked.len()` because the positives are counted in the list itself.
    for (i, &level) in ranked[..r].iter().enumerate() {
        if level >= min_level {
            hits += 1;
            sum += hits as f64 / (i + 1) as f64;
        }
    }
    Some(sum / r as f64)
}

/// R-precision (pytorch-metric-learning `r_precision`): the fraction of positives among the first
/// `R` items, `R` = the number of positives in the list. `None` if there is no positive or
/// `min_level = 0`.
pub fn r_precision(ranked: &[u8], min_level: u8) -> Option<f64> {
    let r = count_positives(ranked, min_level)?;
    let hits = ranked[..r].iter().filter(|&&l| l >= min_level).count();
    Some(hits as f64 / r as f64)
}

/// The metric-learning "R@k" (recall *rate*, HAPPIER Tables 2–4, Smooth-AP Tables 2–3): 1 if at
/// least one positive is among the first `k` items, else 0 — the authors' `recall_rate_at_k`
/// (`sorted_target[:, :k].any(1)`). Not the IR recall (fraction of positives retrieved).
///
/// `k = 0` gives 0 (no item retrieved); `k > n` looks at the whole list, so it is 1 whenever the
/// list has a positive. `None` if the list has no positive or `min_level = 0`.
pub fn recall_at_k(ranked: &[u8], min_level: u8, k: usize) -> Option<f64> {
    if min_level == 0 {
        return None;
    }
    let top = k.min(ranked.len());
    if ranked[..top].iter().any(|&l| l >= min_level) {
        return Some(1.0);
    }
    // No positive in the top k: 0 for a normal query, None for a lone one.
    ranked[top..].iter().any(|&l| l >= min_level).then_some(0.0)
}

/// Precision at `k`: the number of positives among the first `k` items divided by `k`
/// (`P@1` of HAPPIER's code, `precision_at_1` of pytorch-metric-learning).
///
/// When `k > n` the missing positions count as non-relevant and the denominator stays `k` (the
/// standard IR definition). The authors' code (`sorted_target[:, :k].mean(-1)`) would divide by
/// `min(k, n)` instead; the two agree whenever `k ≤ n`, which the full-ranking evaluation always
/// satisfies for the `k` it uses (1). `None` if `k = 0` (precision at 0 is 0/0), if the list has
/// no positive, or if `min_level = 0`.
pub fn precision_at_k(ranked: &[u8], min_level: u8, k: usize) -> Option<f64> {
    if k == 0 {
        return None;
    }
    count_positives(ranked, min_level)?;
    let top = k.min(ranked.len());
    let hits = ranked[..top].iter().filter(|&&l| l >= min_level).count();
    Some(hits as f64 / k as f64)
}

/// Binary Average Set Intersection (HAPPIER supp. B.3 for DyML, the authors' `asi` on a binary
/// target, `with_binary_asi`): `ASI = 1/R · Σ_{n=1..R} |{a_1..a_n} ∩ {b_1..b_n}| / n`, with `b` the
/// ideal list (all `R` positives first). For `n ≤ R` the intersection is the number of
/// positives among the first `n` items, so this is the mean of `P@n` for `n = 1..R`.
///
/// Equal to [`asi`](crate::metrics::asi()) on the list with levels `≥ min_level` mapped to 1 and the
/// others to 0. `None` if the list has no positive or `min_level = 0`.
pub fn binary_asi(ranked: &[u8], min_level: u8) -> Option<f64> {
    let r = count_positives(ranked, min_level)?;
    let mut hits = 0usize;
    let mut sum = 0.0;
    for (i, &level) in ranked[..r].iter().enumerate() {
        if level >= min_level {
            hits += 1;
        }
        sum += hits as f64 / (i + 1) as f64;
    }
    Some(sum / r as f64)
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

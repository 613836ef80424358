//! Precision–recall curves of ranked lists, and their average over queries (Smooth-AP Fig. 1 and
//! supp. Figs. S1–S6 plot one query's curve; a dataset-level figure averages them).
//!
//! The binary curve here and HAPPIER's hierarchical curve
//! ([`hierarchical_pr_curve`](crate::metrics::hierarchical_pr_curve), Eqs. 9–10) share one
//! shape: one `(recall, precision)` point per positive, in list order, recall increasing to 1.

/// The binary precision–recall curve of one ranked list: at each position `k` (1-based) holding
/// a positive (level `≥ min_level`), the point `(R@k, P@k)` with `R@k = rank⁺(k) / |Ω⁺|` the
/// fraction of positives retrieved and `P@k = rank⁺(k) / k`.
///
/// The area under it by the step rule, `Σ_k (R@k − R@(k−1)) · P@k`, is the binary AP of
/// HAPPIER Eq. (1) / Smooth-AP Eq. (2) ([`average_precision`](crate::metrics::average_precision)):
/// recall moves by `1/|Ω⁺|` at each positive. Empty when the list has no positive or
/// `min_level = 0` (where the AP is `None`).
///
/// ```
/// use rankwise::metrics::precision_recall_curve;
/// // Positives at ranks 2 and 5: (recall, precision) at each positive.
/// assert_eq!(precision_recall_curve(&[0, 1, 0, 0, 1], 1), [(0.5, 0.5), (1.0, 0.4)]);
/// ```
pub fn precision_recall_curve(ranked: &[u8], min_level: u8) -> Vec<(f64, f64)> {
    if min_level == 0 {
        return Vec::new();
    }
    let total = ranked.iter().filter(|&&l| l >= min_level).count();
    let mut hits = 0usize;
    let mut curve = Vec::with_capacity(total);
    for (i, &level) in ranked.iter().enumerate() {
        if level >= min_level {
            hits += 1;
            curve.push((hits as f64 / total as f64, hits as f64 / (i + 1) as f64));
        }
    }
    curve
}

/// The interpolated precision of one curve at recall `r`: `max { P : (R, P) on the curve, R ≥ r }`
/// (the usual interpolation, which makes the curve non-increasing), 0 when no point reaches `r`.
pub fn interpolated_precision(curve: &[(f64, f64)], r: f64) -> f64 {
    curve
        .iter()
        .filter(|(recall, _)| *recall >= r)
        .map(|&(_, p)| p)
        .fold(0.0, f64::max)
}

/// The mean interpolated precision–recall curve of many queries, at the given recall levels:
/// `(r, mean over queries of interpolated_precision(curve_q, r))` for each `r`.
///
/// Empty curves (lone queries) are skipped, as the metrics skip them; the result is empty when
/// every curve is. Works for binary and hierarchical curves alike.
pub fn mean_interpolated_precision(
    curves: &[Vec<(f64, f64)>],
    recall_levels: &[f64],
) -> Vec<(f64, f64)> {
    let counted: Vec<&Vec<(f64, f64)>> = curves.iter().filter(|c| !c.is_empty()).collect();
    if counted.is_empty() {
        return Vec::new();
    }
    recall_levels
        .iter()
        .map(|&r| {
            let sum: f64 = counted.iter().map(|c| interpolated_precision(c, r)).sum();
            (r, sum / counted.len() as f64)
        })
        .collect()
}

/// `n + 1` evenly spaced recall levels `0, 1/n, …, 1` (`n = 10` gives the classic 11 points).
pub fn recall_levels(n: usize) -> Vec<f64> {
    let n = n.max(1);
    (0..=n).map(|i| i as f64 / n as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{average_precision, h_ap, hierarchical_pr_curve};

    fn step_area(curve: &[(f64, f64)]) -> f64 {
        let mut prev = 0.0;
        curve
            .iter()
            .map(|&(r, p)| {
                let a = (r - prev) * p;
                prev = r;
                a
            })
            .sum()
    }

    #[test]
    fn curve_of_a_worked_list() {
        // Positives at positions 1, 3, 4 of 5: P = 1, 2/3, 3/4; R = 1/3, 2/3, 1.
        let c = precision_recall_curve(&[1, 0, 1, 1, 0], 1);
        let want = [(1.0 / 3.0, 1.0), (2.0 / 3.0, 2.0 / 3.0), (1.0, 0.75)];
        assert_eq!(c.len(), 3);
        for (got, want) in c.iter().zip(want) {
            assert!((got.0 - want.0).abs() < 1e-15 && (got.1 - want.1).abs() < 1e-15);
        }
        assert!(precision_recall_curve(&[0, 0], 1).is_empty());
        assert!(precision_recall_curve(&[1], 0).is_empty());
        assert!(precision_recall_curve(&[], 1).is_empty());
    }

    #[test]
    fn area_under_the_curves_is_ap_and_h_ap() {
        let lists: [&[u8]; 4] = [
            &[2, 0, 1, 2, 0, 1],
            &[0, 0, 2],
            &[1, 1, 1],
            &[2, 1, 0, 0, 2],
        ];
        let rel = [0.0, 0.5, 1.0];
        for l in lists {
            for min_level in [1, 2] {
                let curve = precision_recall_curve(l, min_level);
                let Some(ap) = average_precision(l, min_level) else {
                    assert!(curve.is_empty());
                    continue;
                };
                let area = step_area(&curve);
                assert!(
                    (area - ap).abs() < 1e-12,
                    "{l:?} {min_level}: {area} vs {ap}"
                );
            }
            let area = step_area(&hierarchical_pr_curve(l, &rel));
            let hap = h_ap(l, &rel).unwrap();
            assert!((area - hap).abs() < 1e-12, "{l:?}: {area} vs {hap}");
        }
    }

    #[test]
    fn interpolation_and_mean() {
        let c = precision_recall_curve(&[1, 0, 1, 1, 0], 1);
        // At r = 0.5 the best precision at recall ≥ 0.5 is max(2/3, 3/4).
        assert_eq!(interpolated_precision(&c, 0.5), 0.75);
        assert_eq!(interpolated_precision(&c, 0.0), 1.0);
        assert_eq!(interpolated_precision(&[], 0.5), 0.0);
        let perfect = precision_recall_curve(&[1, 1, 0], 1);
        let levels = recall_levels(2);
        assert_eq!(levels, [0.0, 0.5, 1.0]);
        let mean = mean_interpolated_precision(&[c, Vec::new(), perfect], &levels);
        assert_eq!(mean, [(0.0, 1.0), (0.5, 0.875), (1.0, 0.875)]);
        assert!(mean_interpolated_precision(&[Vec::new()], &levels).is_empty());
    }
}

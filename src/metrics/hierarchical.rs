//! Hierarchical rank, hierarchical AP and the hierarchical precision-recall curve of HAPPIER
//! (Ramzi et al., ECCV 2022), Eqs. (2), (3) and (9)–(11).
//!
//! The relevance of an item depends only on its level: `rel[l]` is the relevance of every item
//! of level `l` for this query (`rel.len() = L + 1`, `rel[0] = 0`), as given by
//! [`crate::hierarchy::Relevance::level_values`]. A valid table has `rel[0] = 0` and finite,
//! non-negative entries ([`check_level_values`]); the functions return `None` for an invalid
//! table or a list holding a level that has no entry in it (`level ≥ rel.len()`), never a panic.
//!
//! # The exact `O(n·L)` algorithm (digest §A.2.11)
//!
//! Walking the list best first with per-level counters `c_m` of the items seen so far (the
//! current one included), the H-rank of a positive `k` of level `l` is
//! `H-rank(k) = Σ_{m ≥ 1} c_m · min(rel[l], rel[m])`: the `j = k` term is `rel(k)` and every
//! earlier item `j` contributes `min(rel(k), rel(j))`, exactly Eq. (2). Negatives (relevance 0)
//! contribute `min(·, 0) = 0` to every H-rank and nothing to the normaliser, so they are only
//! counted in `rank(k)`, which is the position.
//!
//! # Matching by level, not by value (the authors' quirk)
//!
//! The authors' `metrics.hap` counts the items seen so far *per relevance value*
//! (`sorted_rel == relevances[:, l]` for each level `l`), not per level. When two levels of a
//! query happen to have the same relevance value (possible with the population-normalised
//! relevance of Eq. 4, e.g. `1/c₁ = 2/c₂` on SOP), each item of those levels is counted once per
//! matching level and the H-rank is inflated. [`h_ap`] matches by level index (the paper's
//! Eq. 2); [`h_ap_value_matched`] reproduces the authors' behaviour for comparison. They agree
//! whenever the positive levels have distinct relevance values.

use super::MAX_LEVELS;
use crate::error::{Error, Result};

/// Checks a per-level relevance table (HAPPIER Eq. 4 or Property 1 values): non-empty,
/// `rel[0] = 0` (negatives have no relevance) and every entry finite and `≥ 0`.
///
/// The metric functions return `None` on a table that fails this check; call it once per
/// relevance table to get a clear error instead.
///
/// ```
/// use rankwise::metrics::check_level_values;
/// assert!(check_level_values(&[0.0, 0.5, 1.0]).is_ok());
/// let e = check_level_values(&[0.2, 1.0]).unwrap_err().to_string();
/// assert!(e.contains("rel[0]"), "{e}");
/// ```
pub fn check_level_values(rel: &[f64]) -> Result<()> {
    match rel.first() {
        None => {
            return Err(Error::invalid(
                "rel",
                "empty relevance table (needs one value per level 0..=L)",
            ))
        }
        Some(&r0) if r0 != 0.0 => {
            return Err(Error::invalid(
                "rel",
                format!("rel[0] (negatives) must be 0, got {r0}"),
            ))
        }
        Some(_) => {}
    }
    if let Some((l, r)) = rel
        .iter()
        .enumerate()
        .find(|(_, r)| !r.is_finite() || **r < 0.0)
    {
        return Err(Error::invalid(
            "rel",
            format!("rel[{l}] must be finite and ≥ 0, got {r}"),
        ));
    }
    Ok(())
}

/// Highest level with an entry in a valid table, or `None` for an invalid one.
fn top_level(rel: &[f64]) -> Option<usize> {
    check_level_values(rel).ok()?;
    // Levels are u8: entries beyond 255 can never be looked up.
    Some(rel.len().min(MAX_LEVELS) - 1)
}

/// How earlier items are counted in an H-rank: per level (Eq. 2) or per relevance value (the
/// authors' code).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Matching {
    ByLevel,
    ByValue,
}

/// Walks `ranked` once and calls `visit(i, rel_k, h_rank_k)` for every item of positive
/// relevance, `i` its 0-based position. Returns the total relevance `Σ_{k ∈ Ω⁺} rel(k)` when it
/// is positive; `None` for an invalid table, a level outside it, or no positive item (the caller
/// then discards whatever `visit` saw).
fn walk_h_ranks(
    ranked: &[u8],
    rel: &[f64],
    matching: Matching,
    visit: impl FnMut(usize, f64, f64),
) -> Option<f64> {
    // Every item, level 0 included: a table may give level 0 a relevance.
    walk_h_ranks_of(ranked.iter().copied().enumerate(), rel, matching, visit)
}

/// H-AP of a list read through its positives ([`super::RankedLevels`]): the engine's path.
/// Equal to [`h_ap`] of the dense list, bit for bit, when `rel[0] = 0` (level-0 items then
/// only shift positions, and the walk visits the same items in the same order).
pub(crate) fn h_ap_of(ranked: &(impl super::RankedLevels + ?Sized), rel: &[f64]) -> Option<f64> {
    debug_assert!(rel.first().is_none_or(|&r| r == 0.0));
    let mut sum = 0.0;
    let total = walk_h_ranks_of(
        ranked.positives(),
        rel,
        Matching::ByLevel,
        |i, _, h_rank| {
            sum += h_rank / (i + 1) as f64;
        },
    )?;
    Some(sum / total)
}

/// [`walk_h_ranks`] over `(position, level)` items in rank order.
fn walk_h_ranks_of(
    items: impl Iterator<Item = (usize, u8)>,
    rel: &[f64],
    matching: Matching,
    mut visit: impl FnMut(usize, f64, f64),
) -> Option<f64> {
    let top = top_level(rel)?;
    // weight[m] = how many times an item of level m is counted in an H-rank: once per level
    // (Eq. 2), or once per level sharing its relevance value (the authors' value matching).
    let mut weight = [1.0f64; MAX_LEVELS];
    if matching == Matching::ByValue {
        for m in 1..=top {
            weight[m] = (1..=top).filter(|&p| rel[p] == rel[m]).count() as f64;
        }
    }
    let mut seen = [0usize; MAX_LEVELS];
    let mut total = 0.0;
    for (i, level) in items {
        let l = level as usize;
        if l > top {
            return None;
        }
        let r = rel[l];
        if r <= 0.0 {
            // A negative: it only moves the positions of the items after it.
            continue;
        }
        seen[l] += 1;
        total += r;
        // Levels not seen yet add 0 · min(…) = 0 (the table is finite), so no branch is needed.
        let mut h_rank = 0.0;
        for m in 1..=top {
            h_rank += weight[m] * seen[m] as f64 * r.min(rel[m]);
        }
        visit(i, r, h_rank);
    }
    (total > 0.0).then_some(total)
}

/// H-AP of one query, HAPPIER Eq. (3):
/// `H-AP = 1/Σ_{k ∈ Ω⁺} rel(k) · Σ_{k ∈ Ω⁺} H-rank(k) / rank(k)`, with
/// `H-rank(k) = rel(k) + Σ_{j ∈ Ω⁺} min(rel(k), rel(j)) · H(s_j − s_k)` (Eq. 2).
///
/// `O(n·L)` (module doc). Items are matched by level index, as Eq. (2) reads; see
/// [`h_ap_value_matched`] for the authors' value matching. With `L = 1` and `rel = [0, 1]` this is
/// the binary AP; with the relevance of HAPPIER Property 1 it is `Σ_l w_l · AP^(l)`.
///
/// `None` if the list has no item of positive relevance, the table is invalid
/// ([`check_level_values`]) or a level has no entry in it.
///
/// ```
/// use rankwise::metrics::{average_precision, h_ap};
/// // Two lists consistent with HAPPIER supp. Fig. 8: a "Lada #2" query, L = 3, raw level
/// // weights 1/3, 2/3, 1.
/// let rel = [0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0];
/// let top = [2, 3, 0, 1, 3]; // another Lada first
/// let bottom = [1, 3, 0, 1, 3]; // another car first
/// assert!((h_ap(&top, &rel).unwrap() - 47.0 / 60.0).abs() < 1e-12); // 0.783
/// assert!((h_ap(&bottom, &rel).unwrap() - 107.0 / 160.0).abs() < 1e-12); // 0.669
/// // Binary AP (positives: the same model) cannot tell them apart: 0.45 for both.
/// assert_eq!(average_precision(&top, 3), average_precision(&bottom, 3));
/// ```
pub fn h_ap(ranked: &[u8], rel: &[f64]) -> Option<f64> {
    h_ap_with(ranked, rel, Matching::ByLevel)
}

/// H-AP exactly as the authors' `metrics.hap` computes it: earlier items are counted per
/// relevance *value* (`sorted_rel == relevances[:, l]` for each level `l = 1..L`), so that an item
/// whose level shares its relevance value with `t − 1` other levels is counted `t` times in every
/// H-rank (its own included).
///
/// Equal to [`h_ap`] (Eq. 3) whenever the levels `1..=L` have distinct relevance values; kept to
/// reproduce the published numbers in the rare queries where they do not. `None` in the same
/// cases as [`h_ap`]. `O(n·L + L²)`.
pub fn h_ap_value_matched(ranked: &[u8], rel: &[f64]) -> Option<f64> {
    h_ap_with(ranked, rel, Matching::ByValue)
}

fn h_ap_with(ranked: &[u8], rel: &[f64], matching: Matching) -> Option<f64> {
    let mut sum = 0.0;
    let total = walk_h_ranks(ranked, rel, matching, |i, _, h_rank| {
        sum += h_rank / (i + 1) as f64;
    })?;
    Some(sum / total)
}

/// The H-rank (HAPPIER Eq. 2) of every item of the list, in list order:
/// `H-rank(k) = rel(k) + Σ_{j ∈ Ω⁺} min(rel(k), rel(j)) · H(s_j − s_k)`, and 0 for the items of
/// relevance 0 (for which Eq. 2 gives 0 as well).
///
/// E.g. HAPPIER Fig. 3 with `L = 3`, raw level weights `rel = [0, 1/3, 2/3, 1]` and a "Lada #2"
/// query: the same-model instance ranked second behind another Lada has `H-rank = 1 + 2/3`.
/// `None` in the same cases as [`h_ap`].
///
/// ```
/// use rankwise::metrics::h_ranks;
/// // HAPPIER Fig. 3: the same-model car ranked behind another Lada has H-rank 1 + 2/3.
/// let rel = [0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0];
/// let h = h_ranks(&[2, 3], &rel).unwrap();
/// assert!((h[0] - 2.0 / 3.0).abs() < 1e-15 && (h[1] - 5.0 / 3.0).abs() < 1e-15);
/// ```
pub fn h_ranks(ranked: &[u8], rel: &[f64]) -> Option<Vec<f64>> {
    let mut out = vec![0.0; ranked.len()];
    walk_h_ranks(ranked, rel, Matching::ByLevel, |i, _, h_rank| {
        out[i] = h_rank
    })?;
    Some(out)
}

/// The hierarchical precision-recall curve of HAPPIER Eqs. (9)–(10), one point
/// `(H-R@k, H-P@k)` at each position `k` holding an item of positive relevance, in list order:
///
/// - `H-R@k = Σ_{j ≤ k} rel(j) / Σ_{j ∈ Ω⁺} rel(j)` (Eq. 9),
/// - `H-P@k = Σ_{j ≤ k} min(rel(j), rel(k)) / (k · rel(k)) = H-rank(k) / (k · rel(k))` (Eq. 10).
///
/// Its area by Eq. (11), `Σ_k (H-R@k − H-R@(k−1)) · H-P@k` (with `H-R@0 = 0`), equals [`h_ap`]:
/// the recall only moves at positive positions, by `rel(k) / Σ rel`. Empty when [`h_ap`] is
/// `None`.
pub fn hierarchical_pr_curve(ranked: &[u8], rel: &[f64]) -> Vec<(f64, f64)> {
    let mut curve = Vec::new();
    let mut seen_rel = 0.0;
    let total = walk_h_ranks(ranked, rel, Matching::ByLevel, |i, r, h_rank| {
        seen_rel += r;
        curve.push((seen_rel, h_rank / ((i + 1) as f64 * r)));
    });
    match total {
        Some(total) => {
            for point in &mut curve {
                point.0 /= total;
            }
            curve
        }
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L3: [f64; 4] = [0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0];

    #[test]
    fn fig3_h_ranks() {
        // HAPPIER Fig. 3: instance 2 ("Lada #2", level 3) behind another Lada (level 2) or a
        // generic car (level 1).
        let h = h_ranks(&[2, 3], &L3).unwrap();
        assert!((h[1] - 5.0 / 3.0).abs() < 1e-15);
        let h = h_ranks(&[1, 3], &L3).unwrap();
        assert!((h[1] - 4.0 / 3.0).abs() < 1e-15);
        assert!((h[0] - 1.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn perfect_ranking_has_h_ap_one() {
        let h = h_ap(&[3, 3, 2, 1, 1, 0, 0], &L3).unwrap();
        assert!((h - 1.0).abs() < 1e-15, "{h}");
    }

    #[test]
    fn value_matching_double_counts_equal_relevances() {
        // Levels 1 and 2 share the value 0.5. List [2, 1]: by level, H-rank(pos 1) = 0.5 and
        // H-rank(pos 2) = 0.5 + 0.5 = 1.0, so H-AP = (0.5/1 + 1.0/2) / 1.0 = 1.
        let rel = [0.0, 0.5, 0.5, 1.0];
        assert_eq!(h_ap(&[2, 1], &rel), Some(1.0));
        // By value each item is counted twice: H-ranks 1.0 and 2.0 → (1 + 1) / 1 = 2.
        assert_eq!(h_ap_value_matched(&[2, 1], &rel), Some(2.0));
        // Distinct values: identical.
        let a = h_ap(&[2, 0, 3, 1], &L3).unwrap();
        let b = h_ap_value_matched(&[2, 0, 3, 1], &L3).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn invalid_input_is_none_not_a_panic() {
        assert_eq!(h_ap(&[], &L3), None);
        assert_eq!(h_ap(&[0, 0], &L3), None);
        assert_eq!(h_ap(&[4], &L3), None);
        assert_eq!(h_ap(&[1], &[]), None);
        assert_eq!(h_ap(&[1], &[0.5, 1.0]), None);
        assert_eq!(h_ap(&[1], &[0.0, f64::NAN]), None);
        assert_eq!(h_ap(&[1], &[0.0, -1.0]), None);
        assert!(hierarchical_pr_curve(&[0, 0], &L3).is_empty());
        assert!(hierarchical_pr_curve(&[3, 9], &L3).is_empty());
        assert_eq!(h_ranks(&[0], &L3), None);
    }

    #[test]
    fn check_level_values_names_the_problem() {
        assert!(check_level_values(&L3).is_ok());
        let e = check_level_values(&[]).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = check_level_values(&[1.0, 1.0]).unwrap_err().to_string();
        assert!(e.contains("rel[0]"), "{e}");
        let e = check_level_values(&[0.0, 1.0, f64::INFINITY])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rel[2]"), "{e}");
    }
}

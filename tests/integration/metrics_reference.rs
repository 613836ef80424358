//! Every retrieval metric of `rankwise::metrics` against a brute-force reference written
//! directly from the paper's formula, on many small random ranked lists, plus the worked
//! examples of HAPPIER (Fig. 3, Fig. 8), its Property 1, and the edge cases.

// The references index positions explicitly (`for k in 0..n`, `j < k`) so that they read like
// the sums of the paper, which is their point.
#![allow(clippy::needless_range_loop)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rankwise::hierarchy::level_counts;
use rankwise::metrics::{
    asi, average_precision, binary_asi, h_ap, h_ap_value_matched, h_ranks, hierarchical_pr_curve,
    map_at_r, ndcg, precision_at_k, r_precision, recall_at_k,
};
use rankwise::Relevance;

const CASES: usize = 3000;

fn assert_close(got: Option<f64>, want: Option<f64>, what: &str, ranked: &[u8]) {
    match (got, want) {
        (Some(g), Some(w)) => assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1.0),
            "{what} on {ranked:?}: got {g}, want {w}"
        ),
        (None, None) => {}
        _ => panic!("{what} on {ranked:?}: got {got:?}, want {want:?}"),
    }
}

/// A random list of levels in `0..=num_levels`, length 0..=24, with a random share of negatives.
fn random_list(rng: &mut ChaCha8Rng, num_levels: u8) -> Vec<u8> {
    let n = rng.random_range(0..=24);
    let p_negative: f64 = rng.random();
    (0..n)
        .map(|_| {
            if rng.random::<f64>() < p_negative {
                0
            } else {
                rng.random_range(1..=num_levels)
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Brute-force references, written from the formulas with explicit loops.
// ---------------------------------------------------------------------------------------------

/// HAPPIER Eq. (1): AP = 1/|Ω⁺| Σ_{k∈Ω⁺} rank⁺(k)/rank(k), ranks from explicit pair loops.
fn ref_ap(ranked: &[u8], min_level: u8) -> Option<f64> {
    let pos = |l: u8| l >= min_level;
    let n_pos = ranked.iter().filter(|&&l| pos(l)).count();
    if n_pos == 0 {
        return None;
    }
    let mut sum = 0.0;
    for k in 0..ranked.len() {
        if !pos(ranked[k]) {
            continue;
        }
        let mut rank = 1;
        let mut rank_pos = 1;
        for j in 0..ranked.len() {
            if j < k {
                rank += 1;
                if pos(ranked[j]) {
                    rank_pos += 1;
                }
            }
        }
        sum += rank_pos as f64 / rank as f64;
    }
    Some(sum / n_pos as f64)
}

/// Precision at position i (1-based), counted explicitly.
fn ref_precision(ranked: &[u8], min_level: u8, i: usize) -> f64 {
    ranked[..i].iter().filter(|&&l| l >= min_level).count() as f64 / i as f64
}

/// Musgrave et al.: mAP@R = 1/R Σ_{i=1..R} P(i)·rel(i), on the list truncated to R.
fn ref_map_at_r(ranked: &[u8], min_level: u8) -> Option<f64> {
    let r = ranked.iter().filter(|&&l| l >= min_level).count();
    if r == 0 {
        return None;
    }
    let truncated = &ranked[..r];
    let mut sum = 0.0;
    for i in 1..=r {
        if truncated[i - 1] >= min_level {
            sum += ref_precision(truncated, min_level, i);
        }
    }
    Some(sum / r as f64)
}

fn ref_r_precision(ranked: &[u8], min_level: u8) -> Option<f64> {
    let r = ranked.iter().filter(|&&l| l >= min_level).count();
    (r > 0).then(|| ref_precision(ranked, min_level, r))
}

fn ref_recall_at_k(ranked: &[u8], min_level: u8, k: usize) -> Option<f64> {
    let any = ranked.iter().any(|&l| l >= min_level);
    let hit = ranked.iter().take(k).any(|&l| l >= min_level);
    any.then_some(if hit { 1.0 } else { 0.0 })
}

fn ref_precision_at_k(ranked: &[u8], min_level: u8, k: usize) -> Option<f64> {
    let any = ranked.iter().any(|&l| l >= min_level);
    let hits = ranked.iter().take(k).filter(|&&l| l >= min_level).count();
    (any && k > 0).then(|| hits as f64 / k as f64)
}

/// HAPPIER Eqs. (2)–(3) with explicit min(rel) sums over the items ranked before k.
fn ref_h_ap(ranked: &[u8], rel: &[f64]) -> Option<f64> {
    let r: Vec<f64> = ranked.iter().map(|&l| rel[l as usize]).collect();
    let total: f64 = r.iter().filter(|&&x| x > 0.0).sum();
    if total <= 0.0 {
        return None;
    }
    let mut sum = 0.0;
    for k in 0..r.len() {
        if r[k] <= 0.0 {
            continue;
        }
        let mut h_rank = r[k];
        let mut rank = 1;
        for j in 0..r.len() {
            if j < k {
                rank += 1;
                if r[j] > 0.0 {
                    h_rank += r[k].min(r[j]);
                }
            }
        }
        sum += h_rank / rank as f64;
    }
    Some(sum / total)
}

/// The authors' `metrics.hap`, literally: for each position p and level l = 1..L,
/// count the items j ≤ p whose relevance *value* equals rel[l].
fn ref_h_ap_value_matched(ranked: &[u8], rel: &[f64]) -> Option<f64> {
    let r: Vec<f64> = ranked.iter().map(|&l| rel[l as usize]).collect();
    let total: f64 = r.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mut sum = 0.0;
    for p in 0..r.len() {
        let mut h_rank = 0.0;
        for &rel_l in &rel[1..] {
            let cum = r[..=p].iter().filter(|&&x| x == rel_l).count();
            h_rank += r[p].min(rel_l) * cum as f64;
        }
        sum += h_rank / (p + 1) as f64;
    }
    Some(sum / total)
}

/// HAPPIER supp. B.3 ASI: build the ideal list, intersect level multisets explicitly.
fn ref_asi(ranked: &[u8], num_levels: u8) -> Option<f64> {
    let mut ideal = ranked.to_vec();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let n_pos = ranked.iter().filter(|&&l| l > 0).count();
    if n_pos == 0 {
        return None;
    }
    let mut sum = 0.0;
    for n in 1..=n_pos {
        let mut common = 0;
        for v in 0..=num_levels {
            let in_a = ranked[..n].iter().filter(|&&l| l == v).count();
            let in_b = ideal[..n].iter().filter(|&&l| l == v).count();
            common += in_a.min(in_b);
        }
        sum += common as f64 / n as f64;
    }
    Some(sum / n_pos as f64)
}

/// NDCG with gains 2^l − 1, discount log2(1 + rank), ideal from explicitly sorted gains.
fn ref_ndcg(ranked: &[u8]) -> Option<f64> {
    let gains: Vec<f64> = ranked.iter().map(|&l| 2f64.powi(l as i32) - 1.0).collect();
    let dcg = |g: &[f64]| -> f64 {
        g.iter()
            .enumerate()
            .map(|(i, g)| g / ((i + 2) as f64).log2())
            .sum()
    };
    let mut ideal = gains.clone();
    ideal.sort_by(|a, b| b.partial_cmp(a).unwrap());
    let idcg = dcg(&ideal);
    (idcg > 0.0).then(|| dcg(&gains) / idcg)
}

/// Binary ASI = ASI on the list binarised at `min_level`.
fn ref_binary_asi(ranked: &[u8], min_level: u8) -> Option<f64> {
    let binary: Vec<u8> = ranked.iter().map(|&l| u8::from(l >= min_level)).collect();
    ref_asi(&binary, 1)
}

/// HAPPIER Eqs. (9)–(10) at every positive position, with explicit sums.
fn ref_pr_curve(ranked: &[u8], rel: &[f64]) -> Vec<(f64, f64)> {
    let r: Vec<f64> = ranked.iter().map(|&l| rel[l as usize]).collect();
    let total: f64 = r.iter().sum();
    let mut curve = Vec::new();
    for k in 0..r.len() {
        if r[k] <= 0.0 {
            continue;
        }
        let recall: f64 = r[..=k].iter().sum::<f64>() / total;
        let precision: f64 =
            r[..=k].iter().map(|&x| x.min(r[k])).sum::<f64>() / ((k + 1) as f64 * r[k]);
        curve.push((recall, precision));
    }
    curve
}

/// A random relevance table for `num_levels` levels: one of the three HAPPIER relevance
/// functions on the list's own level counts, or arbitrary non-negative values (not monotone in
/// the level, as Eq. 4 can be).
fn random_rel(rng: &mut ChaCha8Rng, ranked: &[u8], num_levels: u8) -> Vec<f64> {
    let counts = level_counts(ranked, num_levels as usize);
    let relevance = match rng.random_range(0..4) {
        0 => Relevance::Pop {
            alpha: rng.random_range(0.5..5.0),
            count_query: rng.random(),
        },
        1 => Relevance::Level {
            alpha: rng.random_range(0.5..5.0),
        },
        2 => Relevance::WeightedAp {
            weights: (0..num_levels)
                .map(|_| rng.random_range(0.01..1.0))
                .collect(),
        },
        _ => {
            let mut rel: Vec<f64> = (0..=num_levels).map(|_| rng.random()).collect();
            rel[0] = 0.0;
            return rel;
        }
    };
    relevance.level_values(&counts)
}

// ---------------------------------------------------------------------------------------------
// Brute force vs streaming, on random lists.
// ---------------------------------------------------------------------------------------------

#[test]
fn binary_metrics_match_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for _ in 0..CASES {
        let num_levels = rng.random_range(1..=4);
        let ranked = random_list(&mut rng, num_levels);
        let min_level = rng.random_range(1..=num_levels);
        let k = rng.random_range(0..=ranked.len() + 3);
        let r = &ranked;
        assert_close(
            average_precision(r, min_level),
            ref_ap(r, min_level),
            "AP",
            r,
        );
        assert_close(
            map_at_r(r, min_level),
            ref_map_at_r(r, min_level),
            "mAP@R",
            r,
        );
        assert_close(
            r_precision(r, min_level),
            ref_r_precision(r, min_level),
            "R-precision",
            r,
        );
        assert_close(
            recall_at_k(r, min_level, k),
            ref_recall_at_k(r, min_level, k),
            "R@k",
            r,
        );
        assert_close(
            precision_at_k(r, min_level, k),
            ref_precision_at_k(r, min_level, k),
            "P@k",
            r,
        );
        assert_close(
            binary_asi(r, min_level),
            ref_binary_asi(r, min_level),
            "binary ASI",
            r,
        );
    }
}

#[test]
fn hierarchical_metrics_match_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for _ in 0..CASES {
        let num_levels = rng.random_range(1..=5);
        let ranked = random_list(&mut rng, num_levels);
        let rel = random_rel(&mut rng, &ranked, num_levels);
        let r = &ranked;
        assert_close(h_ap(r, &rel), ref_h_ap(r, &rel), "H-AP", r);
        assert_close(
            asi(r, num_levels as usize),
            ref_asi(r, num_levels),
            "ASI",
            r,
        );
        assert_close(ndcg(r), ref_ndcg(r), "NDCG", r);

        let curve = hierarchical_pr_curve(r, &rel);
        let want = ref_pr_curve(r, &rel);
        assert_eq!(
            curve.len(),
            if ref_h_ap(r, &rel).is_some() {
                want.len()
            } else {
                0
            }
        );
        for (got, want) in curve.iter().zip(&want) {
            assert_close(Some(got.0), Some(want.0), "H-R@k", r);
            assert_close(Some(got.1), Some(want.1), "H-P@k", r);
        }
        // Eq. (11): the area under the curve is H-AP.
        if let Some(h) = h_ap(r, &rel) {
            let mut area = 0.0;
            let mut previous_recall = 0.0;
            for &(recall, precision) in &curve {
                area += (recall - previous_recall) * precision;
                previous_recall = recall;
            }
            assert_close(Some(area), Some(h), "area under the H-PR curve", r);
        }
    }
}

#[test]
fn value_matched_h_ap_matches_the_authors_formula() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let values = [0.25, 0.5, 1.0];
    let mut differed = 0;
    for _ in 0..CASES {
        let num_levels = rng.random_range(1..=4);
        let ranked = random_list(&mut rng, num_levels);
        // Few distinct values, so that levels often share one.
        let mut rel: Vec<f64> = (0..=num_levels)
            .map(|_| values[rng.random_range(0..values.len())])
            .collect();
        rel[0] = 0.0;
        let got = h_ap_value_matched(&ranked, &rel);
        assert_close(
            got,
            ref_h_ap_value_matched(&ranked, &rel),
            "H-AP by value",
            &ranked,
        );
        if got
            .zip(h_ap(&ranked, &rel))
            .is_some_and(|(a, b)| (a - b).abs() > 1e-9)
        {
            differed += 1;
        }
    }
    // The quirk is real: with shared values the authors' number differs from Eq. (3).
    assert!(differed > 100, "{differed}");
}

// ---------------------------------------------------------------------------------------------
// Identities of the paper.
// ---------------------------------------------------------------------------------------------

#[test]
fn h_ap_is_ap_when_there_is_one_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for _ in 0..CASES {
        let ranked = random_list(&mut rng, 1);
        let counts = level_counts(&ranked, 1);
        // Any positive relevance for the single level: H-AP is scale-invariant.
        for rel in [vec![0.0, 1.0], Relevance::default().level_values(&counts)] {
            assert_close(
                h_ap(&ranked, &rel),
                average_precision(&ranked, 1),
                "H-AP (L = 1) vs AP",
                &ranked,
            );
        }
    }
}

#[test]
fn property_1_h_ap_is_the_weighted_sum_of_per_level_aps() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for num_levels in 2..=4u8 {
        for _ in 0..CASES {
            let mut ranked = random_list(&mut rng, num_levels);
            // Every Ω^{+,l} must be non-empty for every AP^(l) to exist: add one fine-level item.
            let at = rng.random_range(0..=ranked.len());
            ranked.insert(at, num_levels);
            let raw: Vec<f64> = (0..num_levels)
                .map(|_| rng.random_range(0.01..1.0))
                .collect();
            let sum: f64 = raw.iter().sum();
            let weights: Vec<f64> = raw.iter().map(|w| w / sum).collect();
            let rel = Relevance::WeightedAp {
                weights: weights.clone(),
            }
            .level_values(&level_counts(&ranked, num_levels as usize));
            let weighted: f64 = (1..=num_levels)
                .map(|l| weights[l as usize - 1] * average_precision(&ranked, l).unwrap())
                .sum();
            assert_close(h_ap(&ranked, &rel), Some(weighted), "Property 1", &ranked);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Worked examples of the paper.
// ---------------------------------------------------------------------------------------------

#[test]
fn happier_fig8_worked_example() {
    // L = 3, raw level weights rel(l) = l / 3 (Relevance::Level with α = 1).
    let top = [2, 3, 0, 1, 3];
    let bottom = [1, 3, 0, 1, 3];
    for (ranked, want) in [(top, 47.0 / 60.0), (bottom, 107.0 / 160.0)] {
        let rel = Relevance::Level { alpha: 1.0 }.level_values(&level_counts(&ranked, 3));
        assert_close(Some(rel[1] * 3.0), Some(1.0), "rel(1) = 1/3", &ranked);
        assert_close(h_ap(&ranked, &rel), Some(want), "Fig. 8 H-AP", &ranked);
        assert_close(
            average_precision(&ranked, 3),
            Some(0.45),
            "Fig. 8 AP",
            &ranked,
        );
    }
}

#[test]
fn happier_fig3_h_ranks() {
    let rel = Relevance::Level { alpha: 1.0 }.level_values(&[0, 0, 0, 0]);
    // "Lada #2" (level 3) ranked behind another Lada (level 2): 1 + 2/3.
    let h = h_ranks(&[2, 3], &rel).unwrap();
    assert_close(Some(h[1]), Some(5.0 / 3.0), "Fig. 3 H-rank", &[2, 3]);
    // ... behind a generic car (level 1): 1 + 1/3.
    let h = h_ranks(&[1, 3], &rel).unwrap();
    assert_close(Some(h[1]), Some(4.0 / 3.0), "Fig. 3 H-rank", &[1, 3]);
}

// ---------------------------------------------------------------------------------------------
// Edge cases.
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_lists_and_lists_without_positives_are_none() {
    let rel = [0.0, 0.5, 1.0];
    for ranked in [&[][..], &[0, 0, 0][..]] {
        assert_eq!(average_precision(ranked, 1), None);
        assert_eq!(map_at_r(ranked, 1), None);
        assert_eq!(r_precision(ranked, 1), None);
        assert_eq!(recall_at_k(ranked, 1, 1), None);
        assert_eq!(precision_at_k(ranked, 1, 1), None);
        assert_eq!(binary_asi(ranked, 1), None);
        assert_eq!(h_ap(ranked, &rel), None);
        assert_eq!(h_ap_value_matched(ranked, &rel), None);
        assert_eq!(asi(ranked, 2), None);
        assert_eq!(ndcg(ranked), None);
        assert!(hierarchical_pr_curve(ranked, &rel).is_empty());
    }
    // Positives only below the threshold.
    assert_eq!(average_precision(&[1, 1], 2), None);
}

#[test]
fn k_zero_and_k_beyond_the_list() {
    let ranked = [0, 2, 1];
    assert_eq!(recall_at_k(&ranked, 1, 0), Some(0.0));
    assert_eq!(precision_at_k(&ranked, 1, 0), None);
    assert_eq!(recall_at_k(&ranked, 1, 10), Some(1.0));
    assert_eq!(recall_at_k(&ranked, 2, usize::MAX), Some(1.0));
    assert_eq!(precision_at_k(&ranked, 1, 10), Some(0.2));
    assert_eq!(
        precision_at_k(&ranked, 1, usize::MAX),
        Some(2.0 / usize::MAX as f64)
    );
}

#[test]
fn lists_of_only_positives_score_one() {
    // One level: every ordering is perfect.
    let flat = [2u8; 7];
    assert_eq!(average_precision(&flat, 1), Some(1.0));
    assert_eq!(average_precision(&flat, 2), Some(1.0));
    assert_eq!(map_at_r(&flat, 2), Some(1.0));
    assert_eq!(ndcg(&flat), Some(1.0));
    assert_eq!(asi(&flat, 2), Some(1.0));
    assert_eq!(binary_asi(&flat, 1), Some(1.0));
    // Several levels: any order is a perfect binary ranking; sorted by level it is a perfect
    // hierarchical one.
    let mixed = [1u8, 3, 2, 3];
    assert_eq!(average_precision(&mixed, 1), Some(1.0));
    let sorted = [3u8, 3, 2, 1];
    let rel = Relevance::Level { alpha: 1.0 }.level_values(&level_counts(&sorted, 3));
    assert_close(h_ap(&sorted, &rel), Some(1.0), "H-AP", &sorted);
    assert_eq!(ndcg(&sorted), Some(1.0));
    assert_eq!(asi(&sorted, 3), Some(1.0));
    assert!(ndcg(&mixed).unwrap() < 1.0);
    assert!(asi(&mixed, 3).unwrap() < 1.0);
}

#[test]
fn malformed_input_never_panics() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for _ in 0..CASES {
        // Levels up to 255, relevance tables of any length, thresholds and k of any value.
        let n = rng.random_range(0..20);
        let ranked: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        let rel: Vec<f64> = (0..rng.random_range(0..6))
            .map(|_| rng.random_range(-1.0..2.0))
            .collect();
        let min_level: u8 = rng.random();
        let k = rng.random_range(0..40);
        let _ = (
            average_precision(&ranked, min_level),
            map_at_r(&ranked, min_level),
            r_precision(&ranked, min_level),
            recall_at_k(&ranked, min_level, k),
            precision_at_k(&ranked, min_level, k),
            binary_asi(&ranked, min_level),
            h_ap(&ranked, &rel),
            h_ap_value_matched(&ranked, &rel),
            h_ranks(&ranked, &rel),
            hierarchical_pr_curve(&ranked, &rel),
            asi(&ranked, rng.random_range(0..300)),
            ndcg(&ranked),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Revisited Oxford/Paris: against values printed by the revisitop `compute_map` (run with numpy
// 2.4.6 on exactly these rankings and ground truths; `np.in1d` replaced by its successor
// `np.isin`, identical on 1-D input).
// ---------------------------------------------------------------------------------------------

#[test]
fn revisited_matches_the_revisitop_code() {
    use rankwise::metrics::revisited::{evaluate, GroundTruth, Protocol, REVISITOP_KAPPAS};
    // Query q ranks reference (a·i + b) mod 15 at position i.
    let rankings: Vec<Vec<usize>> = [(2, 3), (4, 0), (7, 11), (1, 5)]
        .iter()
        .map(|&(a, b)| (0..15).map(|i| (a * i + b) % 15).collect())
        .collect();
    let gt = |easy: &[usize], hard: &[usize], junk: &[usize]| GroundTruth {
        easy: easy.to_vec(),
        hard: hard.to_vec(),
        junk: junk.to_vec(),
    };
    let gnd = [
        gt(&[0, 5, 9], &[3, 12], &[1, 7]),
        gt(&[14], &[2, 6, 10], &[8, 4, 13]),
        gt(&[4, 11, 1, 6], &[], &[0]),
        gt(&[], &[], &[2]),
    ];
    let cases = [
        (
            Protocol::Easy,
            0.45994607244607244,
            [0.6666666666666666, 0.26666666666666666, 0.35555555555555557],
            vec![
                Some(0.85),
                Some(0.08333333333333333),
                Some(0.446504884004884),
                None,
            ],
        ),
        (
            Protocol::Medium,
            0.5045342157842158,
            [0.6666666666666666, 0.26666666666666666, 0.3814814814814815],
            vec![
                Some(0.8046969696969698),
                Some(0.2624007936507936),
                Some(0.446504884004884),
                None,
            ],
        ),
        (
            Protocol::Hard,
            0.40004960317460314,
            [0.5, 0.1, 0.2986111111111111],
            vec![
                Some(0.5868055555555556),
                Some(0.21329365079365076),
                None,
                None,
            ],
        ),
    ];
    for (protocol, map, mp, aps) in cases {
        let report = evaluate(&rankings, &gnd, protocol, &REVISITOP_KAPPAS).unwrap();
        assert_eq!(report.map, map, "{protocol:?} mAP");
        assert_eq!(report.mean_precision_at, mp, "{protocol:?} mP@k");
        let got: Vec<Option<f64>> = report
            .per_query
            .iter()
            .map(|q| q.as_ref().map(|s| s.ap))
            .collect();
        assert_eq!(got, aps, "{protocol:?} per-query AP");
        assert_eq!(report.skipped, aps.iter().filter(|a| a.is_none()).count());
    }
}

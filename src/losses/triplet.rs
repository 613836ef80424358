//! The triplet margin loss with in-batch mining (Weinberger & Saul 2009; semi-hard negatives:
//! Schroff et al., FaceNet, CVPR 2015), with the semantics of pytorch-metric-learning's
//! `TripletMarginLoss` and miners — the "TL_SH" baseline of HAPPIER's tables, which the
//! authors ran through pml (SupRank `losses/triplet_loss.py`).
//!
//! Every item is an anchor `a`; `p` ranges over the other items of its fine class and `n` over
//! the items of other classes. With `x` a distance-like value (`x = −s` for cosine similarity,
//! `x = ‖ê_a − ê_j‖` for the Euclidean distance), a triplet costs
//! `max(0, (x_ap − x_an) + m)` and the loss is the mean over the triplets with a non-zero cost
//! (pml's `AvgNonZeroReducer`; 0 when every mined triplet is satisfied).
//!
//! Mining ([`TripletMining`]):
//! * `All`: every triplet (pml `TripletMarginLoss` without a miner; SupRank `triplet.yaml`).
//! * `SemiHard`: the triplets whose negative is farther than the positive but inside the margin,
//!   `0 < x_an − x_ap ≤ m` (FaceNet's semi-hard condition; pml
//!   `TripletMarginMiner(type_of_triplets="semihard")`).
//! * `EasyPositiveSemiHardNegative`: one triplet per anchor, its closest positive and the
//!   closest negative that is still farther than that positive (pml `BatchEasyHardMiner()` with
//!   its defaults, which SupRank's `TripletLoss(semihard=True)` — `triplet_mining.yaml`, margin
//!   0.05, dot-product similarity — uses). pml computes this row maximum as `max(mat * mask)`,
//!   which picks a masked-out entry when every eligible similarity is negative; here the
//!   intended argmax over eligible items is taken. Ties go to the first column.
//!
//! The sums over all triplets of an anchor are evaluated with sorting and prefix sums in
//! `O((P + N) log(P + N))` per anchor, so coarse-level (Σ) variants with thousands of positives
//! per anchor stay cheap.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{finite, LossContext, LossRecipe};
use crate::losses::pairwise_rows::{chunk_size, fine_ids, row_loss, Input, PairMetric, RowLoss};
use crate::losses::{check_batch, l2_normalize, mean_nonzero, RankLoss};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub mod device;

/// Which triplets of the batch the loss uses (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TripletMining {
    /// Every (anchor, positive, negative) triplet.
    All,
    /// Triplets with `0 < x_an − x_ap ≤ margin` (FaceNet / pml `TripletMarginMiner`).
    SemiHard,
    /// Per anchor: easiest positive and the hardest negative farther than it (pml
    /// `BatchEasyHardMiner` defaults; SupRank's TL_SH).
    #[default]
    EasyPositiveSemiHardNegative,
}

/// Triplet margin loss with mining (see the module documentation).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{triplet::Triplet, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // Each anchor takes its positive (0.8) and the hardest negative *below* it (0.6): cost
/// // 0.6 − 0.8 + m. The negative at 0.96, above the positive, is not semi-hard and is not mined.
/// let loss = Triplet { margin: 0.3, ..Triplet::default() }.forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((loss - 0.1).abs() < 1e-12);
/// assert_eq!(Triplet::default().forward(&x, &labels)?.to_scalar::<f64>()?, 0.0); // m = 0.05
/// # Ok::<(), rankwise::Error>(())
/// ```
///
/// The struct is its own recipe (`[loss] kind = "triplet"`, `margin`, `mining =
/// "easy_positive_semi_hard_negative" | "semi_hard" | "all"`; cosine similarities).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Triplet {
    /// Margin `m` (pml default and SupRank's configs: 0.05).
    pub margin: f64,
    /// Cosine similarity (SupRank) or Euclidean distance (pml default).
    #[serde(skip)]
    pub metric: PairMetric,
    /// Triplet selection.
    pub mining: TripletMining,
    /// Anchors per chunk (`None`: the whole batch at once). Working set `O(chunk × B)`.
    #[serde(skip)]
    pub query_chunk: Option<usize>,
}

impl Default for Triplet {
    /// SupRank's TL_SH (`triplet_mining.yaml`): margin 0.05, dot-product similarity of
    /// normalised embeddings, easy-positive / semi-hard-negative mining.
    fn default() -> Self {
        Triplet {
            margin: 0.05,
            metric: PairMetric::Cosine,
            mining: TripletMining::EasyPositiveSemiHardNegative,
            query_chunk: None,
        }
    }
}

impl Triplet {
    /// The loss as plain candle tensor expressions, its gradient by autograd: the triplets
    /// mined by the rules of the module documentation written as loops, then the cost
    /// `max(0, x_ap − x_an + m)` of every mined triplet as one `B × B × B` tensor and its mean
    /// over the non-zero ones. [`RankLoss::forward`] computes the same value and gradient with
    /// sorted prefix sums per anchor (tested equal).
    pub fn forward_plain(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        LossRecipe::validate(self)?;
        let b = labels.len();
        let e = l2_normalize(embeddings, "embeddings")?;
        let s = e.matmul(&e.t()?)?;
        // x = −s or ‖ê_a − ê_j‖ (the diagonal is never mined).
        let x = self.metric.distance_matrix(&s)?;
        let xs = x.to_dtype(candle_core::DType::F64)?.to_vec2::<f64>()?;
        let fine = labels.column(0);
        let m = self.margin;
        let mut mined = vec![0f64; b * b * b];
        for a in 0..b {
            let positives: Vec<usize> = (0..b).filter(|&j| j != a && fine[j] == fine[a]).collect();
            let negatives: Vec<usize> = (0..b).filter(|&j| fine[j] != fine[a]).collect();
            let mut mine = |p: usize, n: usize| mined[(a * b + p) * b + n] = 1.0;
            match self.mining {
                TripletMining::All => {
                    for &p in &positives {
                        negatives.iter().for_each(|&n| mine(p, n));
                    }
                }
                TripletMining::SemiHard => {
                    for &p in &positives {
                        for &n in &negatives {
                            let gap = xs[a][n] - xs[a][p];
                            if gap > 0.0 && gap <= m {
                                mine(p, n);
                            }
                        }
                    }
                }
                TripletMining::EasyPositiveSemiHardNegative => {
                    // The closest positive, then the closest negative farther than it (first
                    // column on ties).
                    let closest = |items: &mut dyn Iterator<Item = usize>| {
                        items.fold(None, |best: Option<usize>, j| match best {
                            Some(k) if xs[a][k] <= xs[a][j] => Some(k),
                            _ => Some(j),
                        })
                    };
                    if let Some(p) = closest(&mut positives.iter().copied()) {
                        let farther = negatives.iter().copied().filter(|&n| xs[a][n] > xs[a][p]);
                        if let Some(n) = closest(&mut farther.into_iter()) {
                            mine(p, n);
                        }
                    }
                }
            }
        }
        let mined = Tensor::from_vec(mined, (b, b, b), e.device())?.to_dtype(e.dtype())?;
        let cost = (x.unsqueeze(2)?.broadcast_sub(&x.unsqueeze(1)?)? + m)?
            .relu()?
            .mul(&mined)?;
        mean_nonzero(&cost)
    }
}

impl LossRecipe for Triplet {
    fn name(&self) -> String {
        "triplet".into()
    }

    fn validate(&self) -> Result<()> {
        finite("margin", self.margin)
    }

    fn build(&self, _: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.clone()))
    }
}

impl RankLoss for Triplet {
    /// Mean non-zero triplet cost over the mined triplets; positives share the fine class.
    /// Normalises the embeddings itself. Errors when no anchor has both a positive and a
    /// negative.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        if !self.margin.is_finite() {
            return Err(Error::invalid(
                "margin",
                format!("must be finite, got {}", self.margin),
            ));
        }
        // On a GPU: the mining by a kernel, the cost by autograd, on the device (see `device`).
        if let Some(ids) = device::plan(self, embeddings, labels) {
            return device::forward(self, embeddings, labels, ids);
        }
        let chunk = chunk_size(self.query_chunk, labels.len())?;
        let rows = TripletRows {
            loss: self.clone(),
            fine: fine_ids(labels),
        };
        Ok(row_loss(embeddings, Input::Normalise, rows, chunk)?.0)
    }
}

/// One anchor's triplets: loss sum, number of non-zero triplets, number of structural
/// candidates, and (for the gradient) the signed count of active triplets each item takes part
/// in, as `(column, count)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnchorTriplets {
    /// Σ of the non-zero triplet costs.
    pub sum: f64,
    /// Number of triplets with a non-zero cost.
    pub active: usize,
    /// Whether the anchor has at least one positive and one negative.
    pub has_candidates: bool,
    /// `(column, n)`: the item takes part in `n` active triplets as a positive (`n > 0`) or `−n`
    /// as a negative (`n < 0`). Only filled when requested.
    pub counts: Vec<(usize, i64)>,
}

/// The triplets of one anchor from the distance-like values of its positives and negatives,
/// each given as `(column, x)`.
pub fn anchor_triplets(
    positives: &[(usize, f64)],
    negatives: &[(usize, f64)],
    margin: f64,
    mining: TripletMining,
    with_counts: bool,
) -> AnchorTriplets {
    let mut out = AnchorTriplets {
        has_candidates: !positives.is_empty() && !negatives.is_empty(),
        ..AnchorTriplets::default()
    };
    if !out.has_candidates {
        return out;
    }
    match mining {
        TripletMining::EasyPositiveSemiHardNegative => {
            easy_positive_semihard_negative(positives, negatives, margin, with_counts, &mut out)
        }
        TripletMining::All | TripletMining::SemiHard => {
            interval_triplets(positives, negatives, margin, mining, with_counts, &mut out)
        }
    }
    out
}

/// The cost of a triplet before clamping, in pml's order of operations.
fn violation(x_p: f64, x_n: f64, margin: f64) -> f64 {
    (x_p - x_n) + margin
}

/// Whether a (positive, negative) pair is *selected* by the miner and has a non-zero cost. For
/// a fixed positive the negatives satisfying it form an interval of the sorted negatives, and
/// for a fixed negative the positives form an interval of the sorted positives, because every
/// clause is monotone in each argument (floating-point subtraction is monotone).
fn lower_ok(x_p: f64, x_n: f64, mining: TripletMining) -> bool {
    match mining {
        TripletMining::SemiHard => (x_n - x_p) > 0.0,
        _ => true,
    }
}

fn upper_ok(x_p: f64, x_n: f64, margin: f64, mining: TripletMining) -> bool {
    let costs = violation(x_p, x_n, margin) > 0.0;
    match mining {
        TripletMining::SemiHard => costs && (x_n - x_p) <= margin,
        _ => costs,
    }
}

fn interval_triplets(
    positives: &[(usize, f64)],
    negatives: &[(usize, f64)],
    margin: f64,
    mining: TripletMining,
    with_counts: bool,
    out: &mut AnchorTriplets,
) {
    let mut neg = negatives.to_vec();
    neg.sort_by(|a, b| a.1.total_cmp(&b.1));
    let xs_n: Vec<f64> = neg.iter().map(|n| n.1).collect();
    let mut prefix = Vec::with_capacity(xs_n.len() + 1);
    prefix.push(0.0);
    for x in &xs_n {
        prefix.push(prefix.last().copied().unwrap_or(0.0) + x);
    }
    for &(col, x_p) in positives {
        // Negatives with lower_ok false come first in ascending x_n, those with upper_ok true
        // form a prefix: the active ones are [lo, hi).
        let lo = xs_n.partition_point(|&x_n| !lower_ok(x_p, x_n, mining));
        let hi = xs_n.partition_point(|&x_n| upper_ok(x_p, x_n, margin, mining));
        if hi > lo {
            let k = hi - lo;
            out.sum += k as f64 * (x_p + margin) - (prefix[hi] - prefix[lo]);
            out.active += k;
            if with_counts {
                out.counts.push((col, k as i64));
            }
        }
    }
    if with_counts {
        let mut pos = positives.to_vec();
        pos.sort_by(|a, b| a.1.total_cmp(&b.1));
        let xs_p: Vec<f64> = pos.iter().map(|p| p.1).collect();
        for &(col, x_n) in negatives {
            // In ascending x_p, upper_ok turns true and lower_ok turns false: active = [a, b).
            let a = xs_p.partition_point(|&x_p| !upper_ok(x_p, x_n, margin, mining));
            let b = xs_p.partition_point(|&x_p| lower_ok(x_p, x_n, mining));
            if b > a {
                out.counts.push((col, -((b - a) as i64)));
            }
        }
    }
}

fn easy_positive_semihard_negative(
    positives: &[(usize, f64)],
    negatives: &[(usize, f64)],
    margin: f64,
    with_counts: bool,
    out: &mut AnchorTriplets,
) {
    // Closest positive; `min_by` keeps the first of equal values.
    let Some(&(p_col, x_p)) = positives
        .iter()
        .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))
    else {
        return;
    };
    let Some(&(n_col, x_n)) = negatives
        .iter()
        .filter(|n| n.1 > x_p)
        .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))
    else {
        return;
    };
    let v = violation(x_p, x_n, margin);
    if v > 0.0 {
        out.sum += v;
        out.active += 1;
        if with_counts {
            out.counts.push((p_col, 1));
            out.counts.push((n_col, -1));
        }
    }
}

/// The error of a batch where no anchor has both a positive and a negative.
fn no_candidates() -> Error {
    Error::invalid(
        "labels",
        "the triplet loss is undefined for this batch: no anchor has both a positive \
         (same class) and a negative",
    )
}

/// [`no_candidates`] unless some anchor has both a positive and a negative: some class has at
/// least two items and is not the whole batch.
fn check_candidates(labels: &Labels) -> Result<()> {
    let mut sizes = std::collections::HashMap::new();
    let fine = labels.column(0);
    for c in &fine {
        *sizes.entry(c).or_insert(0usize) += 1;
    }
    if sizes.values().any(|&n| n >= 2 && n < fine.len()) {
        Ok(())
    } else {
        Err(no_candidates())
    }
}

struct TripletRows {
    loss: Triplet,
    fine: Arc<Vec<ClassId>>,
}

impl TripletRows {
    fn anchor(&self, q: usize, sims: &[f64], with_counts: bool) -> AnchorTriplets {
        let (mut positives, mut negatives) = (Vec::new(), Vec::new());
        for (j, &s) in sims.iter().enumerate() {
            if j == q {
                continue;
            }
            let x = self.loss.metric.distance(s);
            if self.fine[j] == self.fine[q] {
                positives.push((j, x));
            } else {
                negatives.push((j, x));
            }
        }
        anchor_triplets(
            &positives,
            &negatives,
            self.loss.margin,
            self.loss.mining,
            with_counts,
        )
    }
}

impl RowLoss for TripletRows {
    type Row = AnchorTriplets;
    /// (Σ costs, number of non-zero triplets)
    type Global = (f64, usize);

    fn summarise(&self, q: usize, sims: &[f64]) -> AnchorTriplets {
        self.anchor(q, sims, false)
    }

    fn global(&self, rows: &[AnchorTriplets]) -> Result<(f64, usize)> {
        if !rows.iter().any(|r| r.has_candidates) {
            return Err(no_candidates());
        }
        Ok(rows
            .iter()
            .fold((0.0, 0), |(s, a), r| (s + r.sum, a + r.active)))
    }

    fn value(&self, global: &(f64, usize)) -> f64 {
        match global.1 {
            0 => 0.0,
            n => global.0 / n as f64,
        }
    }

    fn row_grad(
        &self,
        q: usize,
        sims: &[f64],
        row: &AnchorTriplets,
        global: &(f64, usize),
        upstream: f64,
        out: &mut [f64],
    ) {
        if row.active == 0 || global.1 == 0 {
            return;
        }
        let anchor = self.anchor(q, sims, true);
        let inv = upstream / global.1 as f64;
        for (col, count) in anchor.counts {
            // ∂cost/∂x_p = +1 and ∂cost/∂x_n = −1 per active triplet; then dx/ds.
            let x = self.loss.metric.distance(sims[col]);
            out[col] += inv * count as f64 * self.loss.metric.distance_slope(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::{max_abs_diff, value_and_grad};
    use candle_core::Device;

    /// The sorted-sum engine (chunked or not) gives the plain formulation's value and
    /// gradient for every mining, both metrics and several margins.
    #[test]
    fn row_engine_equals_the_plain_formulation() {
        let x = Tensor::randn(0f64, 1.0, (12, 5), &Device::Cpu).unwrap();
        let labels = Labels::from_fine(&[0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 5]).unwrap();
        for mining in [
            TripletMining::All,
            TripletMining::SemiHard,
            TripletMining::EasyPositiveSemiHardNegative,
        ] {
            for metric in [PairMetric::Cosine, PairMetric::Euclidean] {
                for margin in [0.0, 0.05, 0.3, 1.0] {
                    for query_chunk in [None, Some(5)] {
                        let loss = Triplet {
                            margin,
                            metric,
                            mining,
                            query_chunk,
                        };
                        let (v, g) = value_and_grad(|e| loss.forward(e, &labels), &x);
                        let (w, h) = value_and_grad(|e| loss.forward_plain(e, &labels), &x);
                        assert!((v - w).abs() < 1e-12, "{loss:?}: {v} vs {w}");
                        let diff = max_abs_diff(&g, &h);
                        assert!(diff < 1e-12, "{loss:?}: gradients differ by {diff}");
                    }
                }
            }
        }
    }

    /// Brute-force reference: enumerate every triplet.
    fn brute(
        pos: &[(usize, f64)],
        neg: &[(usize, f64)],
        m: f64,
        mining: TripletMining,
    ) -> (f64, usize) {
        let (mut sum, mut active) = (0.0, 0);
        for &(_, xp) in pos {
            for &(_, xn) in neg {
                let v = violation(xp, xn, m);
                let mined = match mining {
                    TripletMining::SemiHard => (xn - xp) > 0.0 && (xn - xp) <= m,
                    _ => true,
                };
                if mined && v > 0.0 {
                    sum += v;
                    active += 1;
                }
            }
        }
        (sum, active)
    }

    #[test]
    fn smooth_ap_worked_example_has_six_violations() {
        // Smooth-AP supp. B.1.6: scores in ranked order s0 s4 s1 s2 s5 s6 s7 s3 with labels
        // 1 0 1 1 0 0 0 1. With cosine (x = −s) and margin 0 the violating pairs are exactly
        // (s4−s1), (s4−s2), (s4−s3), (s5−s3), (s6−s3), (s7−s3).
        let s = [0.9, 0.7, 0.6, 0.2, 0.8, 0.5, 0.4, 0.3];
        let pos: Vec<(usize, f64)> = [0, 1, 2, 3].iter().map(|&i| (i, -s[i])).collect();
        let neg: Vec<(usize, f64)> = [4, 5, 6, 7].iter().map(|&i| (i, -s[i])).collect();
        let t = anchor_triplets(&pos, &neg, 0.0, TripletMining::All, true);
        assert_eq!(t.active, 6);
        let want =
            (0.8 - 0.7) + (0.8 - 0.6) + (0.8 - 0.2) + (0.5 - 0.2) + (0.4 - 0.2) + (0.3 - 0.2);
        assert!((t.sum - want).abs() < 1e-12, "{} vs {want}", t.sum);
        let mut counts = t.counts.clone();
        counts.sort();
        // s1, s2: one violation each; s3: four; s4: three; s5, s6, s7: one each.
        assert_eq!(
            counts,
            vec![(1, 1), (2, 1), (3, 4), (4, -3), (5, -1), (6, -1), (7, -1)]
        );
    }

    #[test]
    fn sorted_sums_equal_brute_force() {
        let xs = [0.31, -0.2, 0.05, 0.44, 0.12, 0.12, -0.07, 0.5, 0.29, 0.0];
        let pos: Vec<(usize, f64)> = xs[..4].iter().copied().enumerate().collect();
        let neg: Vec<(usize, f64)> = xs[4..]
            .iter()
            .enumerate()
            .map(|(i, &x)| (i + 4, x))
            .collect();
        for mining in [TripletMining::All, TripletMining::SemiHard] {
            for m in [0.0, 0.05, 0.2, 1.0] {
                let t = anchor_triplets(&pos, &neg, m, mining, true);
                let (sum, active) = brute(&pos, &neg, m, mining);
                assert_eq!(t.active, active, "{mining:?} m={m}");
                assert!((t.sum - sum).abs() < 1e-12);
                let pos_count: i64 = t.counts.iter().filter(|c| c.1 > 0).map(|c| c.1).sum();
                let neg_count: i64 = t.counts.iter().filter(|c| c.1 < 0).map(|c| -c.1).sum();
                assert_eq!(pos_count as usize, active);
                assert_eq!(neg_count as usize, active);
            }
        }
    }

    #[test]
    fn easy_positive_semihard_negative_picks_one_triplet() {
        // Closest positive x = 0.1; negatives farther than it: 0.12 (closest), 0.3.
        let pos = [(0, 0.4), (1, 0.1)];
        let neg = [(2, 0.05), (3, 0.3), (4, 0.12)];
        let t = anchor_triplets(
            &pos,
            &neg,
            0.05,
            TripletMining::EasyPositiveSemiHardNegative,
            true,
        );
        assert_eq!(t.active, 1);
        assert!((t.sum - 0.03).abs() < 1e-15);
        assert_eq!(t.counts, vec![(1, 1), (4, -1)]);
        // No negative farther than the closest positive: no triplet.
        let t = anchor_triplets(
            &pos,
            &[(2, 0.05)],
            0.05,
            TripletMining::EasyPositiveSemiHardNegative,
            false,
        );
        assert_eq!((t.active, t.has_candidates), (0, true));
    }
}

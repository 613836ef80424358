//! The contrastive (pair) loss with a positive and a negative margin (Hadsell, Chopra, LeCun,
//! CVPR 2006), with the semantics of pytorch-metric-learning's `ContrastiveLoss`, which ROADMAP
//! and SupRank use as their "calibration" loss and the papers' tables as the pairwise baseline.
//!
//! Over every ordered pair `(i, j)`, `i ≠ j`, of the batch (both orders count, as
//! `get_all_pairs_indices` gives them):
//!
//! * cosine similarity `s`: positives cost `max(0, m⁺ − s)`, negatives `max(0, s − m⁻)`
//!   (positives are pushed above `m⁺`, negatives below `m⁻`);
//! * Euclidean distance `d`: positives cost `max(0, d − m⁺)`, negatives `max(0, m⁻ − d)`.
//!
//! The positive and the negative terms are reduced separately and added: by default each is
//! the mean over its *non-zero* entries (pml's `AvgNonZeroReducer`, 0 when none is active);
//! [`PairReduction::Mean`] averages over all pairs of the kind instead. A batch without
//! positive pairs (or without negative pairs) gets 0 from that term, as in pml.

use crate::cpu::host_sums::vectorised;
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{finite, LossContext, LossRecipe};
use crate::losses::pairwise_rows::{chunk_size, fine_ids, row_loss, Input, PairMetric, RowLoss};
use crate::losses::{check_batch, l2_normalize, mean_nonzero, pair_masks, RankLoss};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

mod device;

/// How the per-pair costs of one kind (positive or negative) are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PairReduction {
    /// Mean over the pairs with a non-zero cost (pml's `AvgNonZeroReducer`, the default of its
    /// contrastive and triplet losses).
    #[default]
    AvgNonZero,
    /// Mean over all pairs of the kind (pml's `MeanReducer`).
    Mean,
}

/// Contrastive loss with margins on L2-normalised embeddings (see the module documentation).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{contrastive::Contrastive, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // m⁺ = 0.9: each positive pair (s = 0.8) costs 0.1; m⁻ = 0.6: only the negative pair at 0.96
/// // costs (0.36); each part is the mean over its non-zero pairs.
/// let loss = Contrastive::default().forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((loss - 0.46).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
///
/// The struct is its own recipe (`[loss] kind = "contrastive"`, `pos_margin`, `neg_margin`;
/// cosine similarities, the default reduction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Contrastive {
    /// Positive margin `m⁺`.
    pub pos_margin: f64,
    /// Negative margin `m⁻`.
    pub neg_margin: f64,
    /// Cosine similarity or Euclidean distance.
    #[serde(skip)]
    pub metric: PairMetric,
    /// Reduction of each of the two terms.
    #[serde(skip)]
    pub reduction: PairReduction,
    /// Queries per chunk (`None`: the whole batch at once). Working set `O(chunk × B)`.
    #[serde(skip)]
    pub query_chunk: Option<usize>,
}

impl Default for Contrastive {
    /// ROADMAP's calibration loss (`calibration_loss.py`: pml `ContrastiveLoss` with
    /// `DotProductSimilarity`, `pos_margin = 0.9`, `neg_margin = 0.6`), also SupRank's.
    fn default() -> Self {
        Contrastive {
            pos_margin: 0.9,
            neg_margin: 0.6,
            metric: PairMetric::Cosine,
            reduction: PairReduction::AvgNonZero,
            query_chunk: None,
        }
    }
}

impl Contrastive {
    /// pytorch-metric-learning's default `ContrastiveLoss()`: normalised Euclidean distance,
    /// `pos_margin = 0`, `neg_margin = 1`, average over non-zero costs.
    pub fn pml_default() -> Self {
        Contrastive {
            pos_margin: 0.0,
            neg_margin: 1.0,
            metric: PairMetric::Euclidean,
            ..Contrastive::default()
        }
    }

    /// The loss as plain candle tensor expressions over the `B × B` similarity matrix, its
    /// gradient by autograd: the formula of the module documentation as written, on any
    /// device. [`RankLoss::forward`] computes the same value and gradient row by row, without
    /// the `B × B` graph (tested equal). At an exact duplicate pair (distance 0) the Euclidean
    /// gradient is not finite here; the row engine gives torch's `cdist` zero there.
    pub fn forward_plain(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        LossRecipe::validate(self)?;
        let x = l2_normalize(embeddings, "embeddings")?;
        let s = x.matmul(&x.t()?)?;
        let (pos, neg) = pair_masks(labels, x.dtype(), x.device())?;
        let (pos_cost, neg_cost) = match self.metric {
            // Positives pushed above m⁺, negatives below m⁻.
            PairMetric::Cosine => (
                s.affine(-1.0, self.pos_margin)?.relu()?,
                s.affine(1.0, -self.neg_margin)?.relu()?,
            ),
            // d = √(2 − 2s).
            PairMetric::Euclidean => {
                let d = self.metric.distance_matrix(&s)?;
                (
                    d.affine(1.0, -self.pos_margin)?.relu()?,
                    d.affine(-1.0, self.neg_margin)?.relu()?,
                )
            }
        };
        // Each term is 0 when it has no pair (every cost and mask entry is then 0).
        let term = |cost: Tensor, mask: &Tensor| -> Result<Tensor> {
            let cost = (cost * mask)?;
            match self.reduction {
                PairReduction::AvgNonZero => mean_nonzero(&cost),
                PairReduction::Mean => mean_over_pairs(&cost, mask, mask.device().is_cpu()),
            }
        };
        Ok((term(pos_cost, &pos)? + term(neg_cost, &neg)?)?)
    }
}

/// `Σ cost / max(1, #pairs of mask)`. Off the host the count stays on the device: reading it
/// would wait for the device.
fn mean_over_pairs(cost: &Tensor, mask: &Tensor, on_host: bool) -> Result<Tensor> {
    if on_host {
        let pairs = mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
        return Ok((cost.sum_all()? / pairs.max(1.0))?);
    }
    let pairs = mask.to_dtype(DType::F64)?.sum_all()?.maximum(1.0)?;
    Ok(cost
        .sum_all()?
        .broadcast_div(&pairs.to_dtype(cost.dtype())?)?)
}

/// The cost of one pair and its derivative with respect to the cosine similarity `s`
/// (zero derivative where the cost is clamped at 0).
#[inline]
pub fn pair_cost(
    metric: PairMetric,
    s: f64,
    positive: bool,
    pos_margin: f64,
    neg_margin: f64,
) -> (f64, f64) {
    let (v, slope) = match (metric, positive) {
        (PairMetric::Cosine, true) => (pos_margin - s, -1.0),
        (PairMetric::Cosine, false) => (s - neg_margin, 1.0),
        (PairMetric::Euclidean, true) => {
            let d = metric.distance(s);
            (d - pos_margin, metric.distance_slope(d))
        }
        (PairMetric::Euclidean, false) => {
            let d = metric.distance(s);
            (neg_margin - d, -metric.distance_slope(d))
        }
    };
    if v > 0.0 {
        (v, slope)
    } else {
        (0.0, 0.0)
    }
}

impl LossRecipe for Contrastive {
    fn name(&self) -> String {
        "contrastive".into()
    }

    fn validate(&self) -> Result<()> {
        finite("pos_margin", self.pos_margin)?;
        finite("neg_margin", self.neg_margin)
    }

    fn build(&self, _: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.clone()))
    }
}

impl RankLoss for Contrastive {
    /// The contrastive loss over all ordered pairs of distinct items; positives share the fine
    /// class. Normalises the embeddings itself.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        LossRecipe::validate(self)?;
        let b = labels.len();
        // On CUDA, the pairs reduced by kernels of their own (`device`: both metrics and
        // reductions, tested equal to the row engine).
        if device::applies(self, embeddings) {
            return device::forward(self, embeddings, labels);
        }
        // With the kernels off, on a device, the formula's `B × B` tensors (tested equal to the
        // row engine); not for the Euclidean distance, whose plain gradient at a duplicate pair
        // is not torch's.
        if self.metric == PairMetric::Cosine
            && crate::losses::plain_on_device(embeddings, self.query_chunk, b * b)
        {
            return self.forward_plain(embeddings, labels);
        }
        let chunk = chunk_size(self.query_chunk, b)?;
        let rows = ContrastiveRows {
            loss: self.clone(),
            fine: fine_ids(labels),
        };
        Ok(row_loss(embeddings, Input::Normalise, rows, chunk)?.0)
    }
}

/// Sums and counts of one kind of pair.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Term {
    sum: f64,
    active: usize,
    pairs: usize,
}

impl Term {
    fn add(&mut self, other: &Term) {
        self.sum += other.sum;
        self.active += other.active;
        self.pairs += other.pairs;
    }

    /// The divisor of the term's mean under `reduction` (0 when the term is absent).
    fn divisor(&self, reduction: PairReduction) -> usize {
        match reduction {
            PairReduction::AvgNonZero => self.active,
            PairReduction::Mean => self.pairs,
        }
    }

    fn mean(&self, reduction: PairReduction) -> f64 {
        match self.divisor(reduction) {
            0 => 0.0,
            n => self.sum / n as f64,
        }
    }
}

struct ContrastiveRows {
    loss: Contrastive,
    fine: Arc<Vec<ClassId>>,
}

impl ContrastiveRows {
    /// [`pair_cost`] with this loss's metric and margins.
    #[inline]
    fn pair(&self, s: f64, positive: bool) -> (f64, f64) {
        pair_cost(
            self.loss.metric,
            s,
            positive,
            self.loss.pos_margin,
            self.loss.neg_margin,
        )
    }

    /// [`for_candidates`] over row `q` of `S` without the query's pair with itself: the pairs
    /// of the row that may cost, as `visit(j, S[q, j], positive)` in order of `j`.
    #[inline(always)]
    fn for_costly_pairs(&self, q: usize, sims: &[f64], mut visit: impl FnMut(usize, f64, bool)) {
        let floor = self.negative_floor();
        for_candidates(sims, &self.fine, self.fine[q], floor, |j, s, positive| {
            if j != q {
                visit(j, s, positive);
            }
        });
    }

    /// A similarity at or below which a negative pair's cost is surely 0 (so its slope too):
    /// `m⁻` for [`PairMetric::Cosine`] (`s ≤ m⁻` ⇒ `s − m⁻ ≤ 0` in floating point as well);
    /// for [`PairMetric::Euclidean`] the cost `m⁻ − √(2 − 2s)` is positive only above
    /// `s = 1 − m⁻²/2`, lowered by 1e-9, far more than the rounding of `2 − 2s` and of the
    /// root near it, and `+∞` (never active) when `m⁻ ≤ 0`.
    fn negative_floor(&self) -> f64 {
        let m = self.loss.neg_margin;
        match self.loss.metric {
            PairMetric::Cosine => m,
            PairMetric::Euclidean if m <= 0.0 => f64::INFINITY,
            PairMetric::Euclidean => 1.0 - 0.5 * m * m - 1e-9,
        }
    }
}

/// `s` is above `floor` or NaN: a single negated comparison, which stays one vector compare.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN must count as above
fn above(s: f64, floor: f64) -> bool {
    !(s <= floor)
}

/// Calls `visit(j, S[q, j], positive)`, in order of `j`, for the pairs of a row that may have a
/// cost: every positive (same class as the query, the query itself included) and every
/// negative whose similarity is not at or below `floor` (NaN included).
///
/// Why: on a typical batch nearly every pair is an inactive negative; testing blocks of 8 at
/// once (branch-free, so it vectorises) and walking only blocks that hold a candidate took the
/// summaries and gradient rows from 17% to 8% of the 1-thread contrastive step (B = 256,
/// D = 512, sampled with perf; step 0.87 → 0.77 ms in interleaved runs). The visited pairs and
/// their order are those of the plain loop, so the sums are unchanged bit for bit.
#[inline(always)]
fn for_candidates(
    sims: &[f64],
    fine: &[ClassId],
    fq: ClassId,
    floor: f64,
    mut visit: impl FnMut(usize, f64, bool),
) {
    const BLOCK: usize = 8;
    // The block tests need AVX2's 64-bit compares to be cheap (the baseline build emulates
    // them with 32-bit ones), hence the whole walk in `vectorised`.
    vectorised(
        #[inline(always)]
        move || {
            for (b, (ss, ff)) in sims.chunks(BLOCK).zip(fine.chunks(BLOCK)).enumerate() {
                let any = ss
                    .iter()
                    .zip(ff)
                    .fold(false, |a, (&s, &f)| a | above(s, floor) | (f == fq));
                if !any {
                    continue;
                }
                for (k, (&s, &f)) in ss.iter().zip(ff).enumerate() {
                    let positive = f == fq;
                    if positive || above(s, floor) {
                        visit(b * BLOCK + k, s, positive);
                    }
                }
            }
        },
    )
}

impl RowLoss for ContrastiveRows {
    /// (positive pairs, negative pairs) of the row.
    type Row = (Term, Term);
    type Global = (Term, Term);

    fn summarise(&self, q: usize, sims: &[f64]) -> (Term, Term) {
        // Plain local accumulators: updating the Term behind an `if positive {&mut pos} else
        // {&mut neg}` reference kept every sum in memory, a store-to-load chain per pair.
        let (mut pos_sum, mut pos_active, mut pos_pairs) = (0.0, 0, 0);
        let (mut neg_sum, mut neg_active) = (0.0, 0);
        self.for_costly_pairs(q, sims, |_, s, positive| {
            let (v, _) = self.pair(s, positive);
            // Only active costs are added: adding the inactive ones' +0 changes no sum (the
            // sums start at +0 and stay ≥ 0) but made every pair wait for the previous
            // addition, a chain of B additions per row.
            if positive {
                if v > 0.0 {
                    pos_sum += v;
                    pos_active += 1;
                }
                pos_pairs += 1;
            } else if v > 0.0 {
                neg_sum += v;
                neg_active += 1;
            }
        });
        // Every positive is a candidate, so the negatives are the other items.
        let others = sims.len() - usize::from(q < sims.len());
        (
            Term {
                sum: pos_sum,
                active: pos_active,
                pairs: pos_pairs,
            },
            Term {
                sum: neg_sum,
                active: neg_active,
                pairs: others - pos_pairs,
            },
        )
    }

    fn global(&self, rows: &[(Term, Term)]) -> Result<(Term, Term)> {
        let (mut pos, mut neg) = (Term::default(), Term::default());
        for (p, n) in rows {
            pos.add(p);
            neg.add(n);
        }
        if pos.pairs + neg.pairs == 0 {
            return Err(Error::invalid(
                "embeddings",
                "the contrastive loss needs at least two items",
            ));
        }
        Ok((pos, neg))
    }

    fn value(&self, global: &(Term, Term)) -> f64 {
        let r = self.loss.reduction;
        global.0.mean(r) + global.1.mean(r)
    }

    fn row_grad(
        &self,
        q: usize,
        sims: &[f64],
        _: &(Term, Term),
        global: &(Term, Term),
        upstream: f64,
        out: &mut [f64],
    ) {
        let r = self.loss.reduction;
        let (pos_div, neg_div) = (global.0.divisor(r), global.1.divisor(r));
        self.for_costly_pairs(q, sims, |j, s, positive| {
            let (_, slope) = self.pair(s, positive);
            let div = if positive { pos_div } else { neg_div };
            if slope != 0.0 && div > 0 {
                out[j] = upstream * slope / div as f64;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::{max_abs_diff, value_and_grad};
    use candle_core::Device;

    /// The row engine (chunked or not) gives the plain formulation's value and gradient, for
    /// both metrics and reductions and margins that leave some pairs inactive.
    #[test]
    fn row_engine_equals_the_plain_formulation() {
        let x = Tensor::randn(0f64, 1.0, (11, 5), &Device::Cpu).unwrap();
        let labels = Labels::from_fine(&[0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 5]).unwrap();
        for (metric, pos_margin, neg_margin) in [
            (PairMetric::Cosine, 0.9, 0.6),
            (PairMetric::Cosine, 0.3, 0.1),
            (PairMetric::Euclidean, 0.0, 1.0),
            (PairMetric::Euclidean, 0.4, 1.3),
        ] {
            for reduction in [PairReduction::AvgNonZero, PairReduction::Mean] {
                for query_chunk in [None, Some(3)] {
                    let loss = Contrastive {
                        pos_margin,
                        neg_margin,
                        metric,
                        reduction,
                        query_chunk,
                    };
                    let (v, g) = value_and_grad(|e| loss.forward(e, &labels), &x);
                    let (w, h) = value_and_grad(|e| loss.forward_plain(e, &labels), &x);
                    assert!((v - w).abs() < 1e-12, "{loss:?}: {v} vs {w}");
                    assert!(max_abs_diff(&g, &h) < 1e-12, "{loss:?}");
                }
            }
        }
    }

    /// The mean over pairs as a device computes it (the count never read back) equals the
    /// host's, with pairs and without (then 0, not NaN), in f32 and f64.
    #[test]
    fn the_device_mean_over_pairs_is_the_hosts() {
        for dtype in [DType::F32, DType::F64] {
            let cost = Tensor::new(&[[0.5f64, 0.0, 0.25], [0.0, 1.5, 0.0]], &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            for mask in [[[1.0f64, 0.0, 1.0], [0.0, 1.0, 1.0]], [[0.0; 3]; 2]] {
                let mask = Tensor::new(&mask, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let cost = (&cost * &mask).unwrap();
                let value = |on_host| {
                    mean_over_pairs(&cost, &mask, on_host)
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_scalar::<f64>()
                        .unwrap()
                };
                let (host, device) = (value(true), value(false));
                assert!(
                    (host - device).abs() <= 1e-7 * host.abs(),
                    "{host} vs {device}"
                );
                assert!(device.is_finite());
            }
        }
    }

    #[test]
    fn pair_costs_follow_pml() {
        // Cosine: positives below m⁺ and negatives above m⁻ cost.
        assert_eq!(
            pair_cost(PairMetric::Cosine, 0.5, true, 0.9, 0.6),
            (0.4, -1.0)
        );
        assert_eq!(
            pair_cost(PairMetric::Cosine, 0.95, true, 0.9, 0.6),
            (0.0, 0.0)
        );
        let (v, g) = pair_cost(PairMetric::Cosine, 0.7, false, 0.9, 0.6);
        assert!((v - 0.1).abs() < 1e-15 && g == 1.0);
        // Euclidean with s = 0.5: d = 1. Positive with m⁺ = 0: cost 1, dd/ds = −1.
        assert_eq!(
            pair_cost(PairMetric::Euclidean, 0.5, true, 0.0, 1.0),
            (1.0, -1.0)
        );
        // Negative at d = 1 with m⁻ = 1 costs nothing.
        assert_eq!(
            pair_cost(PairMetric::Euclidean, 0.5, false, 0.0, 1.0),
            (0.0, 0.0)
        );
    }

    #[test]
    fn terms_average_over_active_or_all_pairs() {
        let t = Term {
            sum: 1.5,
            active: 3,
            pairs: 6,
        };
        assert_eq!(t.mean(PairReduction::AvgNonZero), 0.5);
        assert_eq!(t.mean(PairReduction::Mean), 0.25);
        assert_eq!(Term::default().mean(PairReduction::AvgNonZero), 0.0);
    }

    /// The row logic as a plain loop over every pair (what [`for_candidates`] must reproduce).
    fn plain_row(rows: &ContrastiveRows, q: usize, sims: &[f64]) -> ((Term, Term), Vec<f64>) {
        let fq = rows.fine[q];
        let (mut pos, mut neg) = (Term::default(), Term::default());
        for (j, (&s, &f)) in sims.iter().zip(rows.fine.iter()).enumerate() {
            if j == q {
                continue;
            }
            let (v, _) = rows.pair(s, f == fq);
            let t = if f == fq { &mut pos } else { &mut neg };
            t.pairs += 1;
            if v > 0.0 {
                t.sum += v;
                t.active += 1;
            }
        }
        let r = rows.loss.reduction;
        let (pd, nd) = (pos.divisor(r), neg.divisor(r));
        let mut grad = vec![0.0; sims.len()];
        for (j, (&s, &f)) in sims.iter().zip(rows.fine.iter()).enumerate() {
            let (_, slope) = rows.pair(s, f == fq);
            let div = if f == fq { pd } else { nd };
            if j != q && slope != 0.0 && div > 0 {
                grad[j] = 0.7 * slope / div as f64;
            }
        }
        ((pos, neg), grad)
    }

    #[test]
    fn candidate_pairs_give_the_plain_loop_bit_for_bit() {
        // Rows of 37 (a short last block) with similarities spread over [−1, 1], values placed
        // exactly at and next to each floor, and both metrics over margins from inactive to
        // all-active; the summaries and gradient rows must be those of the plain loop.
        let b = 37;
        let fine: Vec<ClassId> = (0..b).map(|i| (i % 5) as ClassId).collect();
        for (metric, margins) in [
            (
                PairMetric::Cosine,
                vec![(0.9, 0.6), (0.5, -0.2), (1.0, 0.99), (0.0, 1.5)],
            ),
            (
                PairMetric::Euclidean,
                vec![
                    (0.0, 1.0),
                    (0.3, 0.5),
                    (0.1, 0.0),
                    (0.0, 1.9),
                    (0.0, 3.0),
                    (0.2, 1e-4),
                ],
            ),
        ] {
            for (pm, nm) in margins {
                for reduction in [PairReduction::AvgNonZero, PairReduction::Mean] {
                    let rows = ContrastiveRows {
                        loss: Contrastive {
                            pos_margin: pm,
                            neg_margin: nm,
                            metric,
                            reduction,
                            query_chunk: None,
                        },
                        fine: Arc::new(fine.clone()),
                    };
                    let floor = rows.negative_floor();
                    for q in [0, 3, 36] {
                        let sims: Vec<f64> = (0..b)
                            .map(|j| match (j * 7 + q) % 9 {
                                0 if floor.is_finite() => floor,
                                1 if floor.is_finite() => floor.next_up(),
                                2 if floor.is_finite() => floor.next_down(),
                                _ => ((j * 31 + q * 17) % 41) as f64 / 20.0 - 1.0,
                            })
                            .collect();
                        let (want, want_grad) = plain_row(&rows, q, &sims);
                        let got = rows.summarise(q, &sims);
                        assert_eq!(got, want, "{metric:?} {pm} {nm} q = {q}");
                        let global = rows.global(std::slice::from_ref(&got)).unwrap();
                        let mut out = vec![0.0; b];
                        rows.row_grad(q, &sims, &got, &global, 0.7, &mut out);
                        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&out), bits(&want_grad), "{metric:?} {pm} {nm} q = {q}");
                    }
                }
            }
        }
    }
}

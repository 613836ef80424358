//! ROADMAP (Ramzi et al., NeurIPS 2021; a baseline in HAPPIER's tables): the SupAP loss, whose
//! rank over the negatives uses the smooth upper bound `H_s^<` (HAPPIER Eq. 44 cites it from
//! ROADMAP) while the rank over the positives stays exact, plus the calibration loss that
//! reduces the decomposability gap between batch AP and dataset AP.
//!
//! The calibration term is, in the authors' code, pytorch-metric-learning's `ContrastiveLoss`
//! on dot products of normalised embeddings with `pos_margin = 0.9`, `neg_margin = 0.6` and the
//! `AvgNonZeroReducer`: `mean_{nonzero}(relu(0.9 − s_pos)) + mean_{nonzero}(relu(s_neg − 0.6))`
//! over ordered pairs `i ≠ j`. The ROADMAP repository's `roadmap.yaml` adds it with weight 1 to
//! SupAP with weight 1 ([`Roadmap::default`]); the SupRank code weighs them 0.9 / 0.1.
//!
//! History worth knowing when comparing with published ROADMAP numbers: the paper-era code's
//! linear branch of `H_s^<` was `ρ t + offset` (no `− δ`); set [`UpperStep::legacy_linear`] to
//! reproduce it.

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::config::{finite, LossContext, LossRecipe};
use crate::losses::contrastive::{Contrastive, PairReduction};
use crate::losses::pairwise_rows::PairMetric;
use crate::losses::smooth_rank::{
    similarity_matrix, smooth_average_precision, Engine, PairSurrogates, QueryAp, RankProblem,
};
use crate::losses::surrogate::{Heaviside, UpperStep};
use crate::losses::{check_batch, mean_nonzero, pair_masks, RankLoss};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// SupAP: `1 − mean_q AP_s(q)` with `rank⁻` smoothed by `H_s^<` and `rank⁺` exact (no gradient),
/// binary relevance on the fine class.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{roadmap::SupAp, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // H_s^< bounds the step from above, so SupAP is an upper bound of 1 − mAP (= 0.25 here).
/// let loss = SupAp::default().forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!(loss >= 0.25);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SupAp {
    /// `H_s^<` on (positive k, negative j) pairs.
    pub rank_lower: UpperStep,
    /// Exact step on (positive, positive) pairs (`H(0) = 1`).
    pub heaviside: Heaviside,
    /// The query as an item of its own retrieval set (authors' code: true; paper: false).
    pub include_self: bool,
    /// L2-normalise the embeddings first.
    pub normalize: bool,
    /// Computation engine.
    pub engine: Engine,
    /// Queries per chunk (`None` = all at once).
    pub query_chunk: Option<usize>,
}

impl Default for SupAp {
    /// The paper's surrogate (continuous offset), the query not in its own retrieval set.
    fn default() -> Self {
        SupAp {
            rank_lower: UpperStep::default(),
            heaviside: Heaviside::default(),
            include_self: false,
            normalize: true,
            engine: Engine::Streaming,
            query_chunk: None,
        }
    }
}

impl SupAp {
    /// The authors' SOP configuration (`supap.yaml`, after the `− δ` fix): offset 1.44 and the
    /// query in its own retrieval set.
    pub fn authors_code() -> Self {
        SupAp {
            rank_lower: UpperStep::sop_code(),
            include_self: true,
            ..Self::default()
        }
    }

    /// The pair surrogates: `H_s^<` for negatives in the rank, the exact step elsewhere.
    pub fn surrogates(&self) -> PairSurrogates {
        let h = self.heaviside.into();
        PairSurrogates {
            rank: [self.rank_lower.into(), h, h],
            hrank: [h, h, h],
        }
    }

    /// Smooth AP of every query, differentiable.
    pub fn per_query(&self, embeddings: &Tensor, labels: &Labels) -> Result<QueryAp> {
        check_batch(embeddings, labels)?;
        let scores = similarity_matrix(embeddings, self.normalize)?;
        let problem = RankProblem::binary(labels, self.include_self)?;
        smooth_average_precision(
            &scores,
            &problem,
            &self.surrogates(),
            self.engine,
            self.query_chunk,
        )
    }
}

impl RankLoss for SupAp {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        self.per_query(embeddings, labels)?.mean_loss()
    }
}

/// ROADMAP's calibration loss: a contrastive loss on cosine similarities with margins, each
/// part averaged over its non-zero terms (pytorch-metric-learning's `AvgNonZeroReducer`).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{roadmap::Calibration, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // Positive pairs below 0.9 cost 0.9 − 0.8 = 0.1; negative pairs above 0.6 cost 0.96 − 0.6;
/// // each part is averaged over its non-zero pairs.
/// let loss = Calibration::default().forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((loss - (0.1 + 0.36)).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Positive pairs are pushed above this similarity (0.9).
    pub pos_margin: f64,
    /// Negative pairs are pushed below this similarity (0.6).
    pub neg_margin: f64,
    /// L2-normalise the embeddings (pytorch-metric-learning's default for dot products).
    pub normalize: bool,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            pos_margin: 0.9,
            neg_margin: 0.6,
            normalize: true,
        }
    }
}

impl RankLoss for Calibration {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        for (name, m) in [
            ("pos_margin", self.pos_margin),
            ("neg_margin", self.neg_margin),
        ] {
            if !m.is_finite() {
                return Err(Error::invalid(name, format!("must be finite, got {m}")));
            }
        }
        if self.normalize {
            // The same pairs, costs and reduction as the contrastive loss's row engine, which
            // runs in O(chunk × B) host passes instead of five B × B tensors (ROADMAP at
            // B = 4096 peaked at 1.75 GiB with them).
            return Contrastive {
                pos_margin: self.pos_margin,
                neg_margin: self.neg_margin,
                metric: PairMetric::Cosine,
                reduction: PairReduction::AvgNonZero,
                query_chunk: None,
            }
            .forward(embeddings, labels);
        }
        self.tensor_forward(embeddings, labels)
    }
}

impl Calibration {
    /// The loss with `B × B` tensor ops (dot products of the embeddings as given, or of their
    /// normalised rows when `normalize`).
    fn tensor_forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        let s = similarity_matrix(embeddings, self.normalize)?;
        let (pos, neg) = pair_masks(labels, s.dtype(), s.device())?;
        let pos_loss = s.affine(-1.0, self.pos_margin)?.relu()?.mul(&pos)?;
        let neg_loss = (&s - self.neg_margin)?.relu()?.mul(&neg)?;
        Ok((mean_nonzero(&pos_loss)? + mean_nonzero(&neg_loss)?)?)
    }
}

/// ROADMAP = `sup_ap_weight · SupAP + calibration_weight · Calibration`.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::roadmap::{Calibration, Roadmap, SupAp};
/// use rankwise::losses::RankLoss;
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// let roadmap = Roadmap { calibration_weight: 0.1, ..Roadmap::default() };
/// let sum = SupAp::default().forward(&x, &labels)?.to_scalar::<f64>()?
///     + 0.1 * Calibration::default().forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((roadmap.forward(&x, &labels)?.to_scalar::<f64>()? - sum).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
///
/// The struct is its own recipe (`[loss] kind = "roadmap"`, `sup_ap_weight`,
/// `calibration_weight`; the two terms with their defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Roadmap {
    /// The SupAP term.
    #[serde(skip)]
    pub sup_ap: SupAp,
    /// The calibration term.
    #[serde(skip)]
    pub calibration: Calibration,
    /// Weight of SupAP (1.0 in the ROADMAP repository; 0.9 in SupRank).
    pub sup_ap_weight: f64,
    /// Weight of the calibration loss (1.0 in the ROADMAP repository; 0.1 in SupRank).
    pub calibration_weight: f64,
}

impl Default for Roadmap {
    fn default() -> Self {
        Roadmap {
            sup_ap: SupAp::default(),
            calibration: Calibration::default(),
            sup_ap_weight: 1.0,
            calibration_weight: 1.0,
        }
    }
}

impl LossRecipe for Roadmap {
    fn name(&self) -> String {
        "roadmap".into()
    }

    fn validate(&self) -> Result<()> {
        finite("sup_ap_weight", self.sup_ap_weight)?;
        finite("calibration_weight", self.calibration_weight)
    }

    fn build(&self, _: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.clone()))
    }
}

impl RankLoss for Roadmap {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        let a = self.sup_ap.forward(embeddings, labels)?;
        let c = self.calibration.forward(embeddings, labels)?;
        Ok(((a * self.sup_ap_weight)? + (c * self.calibration_weight)?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn normalised_calibration_equals_its_tensor_form() {
        // Margins that make both kinds of pair active on random data, f64.
        let (b, d) = (24, 6);
        let data: Vec<f64> = (0..b * d)
            .map(|i| ((i * 7919 % 997) as f64 / 997.0 - 0.5) + if i % d == 0 { 0.8 } else { 0.0 })
            .collect();
        let x = Tensor::from_vec(data, (b, d), &Device::Cpu).unwrap();
        let labels = Labels::from_fine(&(0..b as i64).map(|i| i / 4).collect::<Vec<_>>()).unwrap();
        for (pos_margin, neg_margin) in [(0.9, 0.6), (0.5, 0.1), (1.0, -1.0)] {
            let calib = Calibration {
                pos_margin,
                neg_margin,
                normalize: true,
            };
            let v = candle_core::Var::from_tensor(&x).unwrap();
            let fast = calib.forward(v.as_tensor(), &labels).unwrap();
            let slow = calib.tensor_forward(v.as_tensor(), &labels).unwrap();
            let (gf, gs) = (fast.backward().unwrap(), slow.backward().unwrap());
            let value = |t: &Tensor| t.to_scalar::<f64>().unwrap();
            assert!(
                (value(&fast) - value(&slow)).abs() < 1e-12,
                "{pos_margin}/{neg_margin}"
            );
            let grad = |g: &candle_core::backprop::GradStore| -> Vec<f64> {
                g.get(&v).unwrap().flatten_all().unwrap().to_vec1().unwrap()
            };
            for (a, b) in grad(&gf).iter().zip(grad(&gs)) {
                assert!(
                    (a - b).abs() < 1e-12,
                    "{pos_margin}/{neg_margin}: {a} vs {b}"
                );
            }
        }
    }
}

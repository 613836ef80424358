//! Smooth-AP (Brown et al., ECCV 2020): AP with every step `1{s_j > s_k}` replaced by the
//! temperature sigmoid (Eq. 6), averaged over every query of the batch (Eq. 7).
//!
//! Differences from the authors' `SmoothAP` module, on purpose:
//! * any labels work (the original needs class-contiguous, equal-size groups and reads the
//!   classes from positions, Smooth_AP issues #1, #14, #21); positives are the items sharing
//!   the query's fine class (column 0 of [`Labels`]);
//! * `include_self` chooses between the paper (the query is not in its own retrieval set,
//!   default) and the code (the query is an item of its own retrieval and positive sets, so
//!   `|P|` counts it and it sits at rank ≈ 1);
//! * memory is `O(B)` per query instead of `O(B³)` (see [`crate::losses::smooth_rank`]).

use crate::error::Result;
use crate::hierarchy::Labels;
use crate::losses::config::{positive, LossContext, LossRecipe};
use crate::losses::smooth_rank::{
    similarity_matrix, smooth_average_precision, Engine, PairSurrogates, QueryAp, RankProblem,
};
use crate::losses::surrogate::Sigmoid;
use crate::losses::{check_batch, RankLoss};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// Smooth-AP loss `L_AP = (1/m) Σ_q (1 − AP_q)` (Smooth-AP Eq. 7) with the sigmoid of Eq. (6)
/// in both `R(i, S_P)` and `R(i, S_Ω)` (Eq. 5), `j ≠ i` excluded from both sums.
///
/// A query whose class has no other sample in the batch has no positive (paper protocol) and is
/// left out of the mean; a batch where no query has a positive is an error.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{smooth_ap::SmoothAp, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // Items 1 and 3 rank a negative (s13 = 0.96) above their positive: AP 1/2 each, mAP 0.75.
/// let exact = SmoothAp { tau: 1e-8, ..SmoothAp::default() }.forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((exact - 0.25).abs() < 1e-12); // 1 − mAP as τ → 0
/// let smooth = SmoothAp::default().forward(&x, &labels)?.to_scalar::<f64>()?; // τ = 0.01
/// assert!(smooth != exact && (smooth - 0.25).abs() < 0.05);
/// # Ok::<(), rankwise::Error>(())
/// ```
///
/// The struct is its own recipe (`[loss] kind = "smooth_ap"`, `tau`, `include_self`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmoothAp {
    /// Sigmoid temperature τ (0.01 in every experiment of the paper).
    pub tau: f64,
    /// Whether the query is an item of its own retrieval and positive sets (authors' code:
    /// `true`; paper: `false`, the default).
    pub include_self: bool,
    /// L2-normalise the embeddings first, so that scores are cosine similarities (Eq. 1).
    /// The authors' network normalises its output, which makes this a no-op there.
    #[serde(skip)]
    pub normalize: bool,
    /// Computation engine (same values and gradients).
    #[serde(skip)]
    pub engine: Engine,
    /// Queries per chunk (`None` = all at once); changes memory only.
    #[serde(skip)]
    pub query_chunk: Option<usize>,
}

impl Default for SmoothAp {
    fn default() -> Self {
        SmoothAp {
            tau: 0.01,
            include_self: false,
            normalize: true,
            engine: Engine::Streaming,
            query_chunk: None,
        }
    }
}

impl SmoothAp {
    /// The authors' code configuration: the query counted in its own retrieval and positive
    /// sets (their `SmoothAP` module, and ROADMAP's/SupRank's ports, which all agree).
    pub fn authors_code() -> Self {
        SmoothAp {
            include_self: true,
            ..Self::default()
        }
    }

    /// The pair surrogates: the sigmoid everywhere.
    pub fn surrogates(&self) -> PairSurrogates {
        PairSurrogates::uniform(Sigmoid { tau: self.tau }.into())
    }

    /// Smooth AP of every query (before `1 − mean`), differentiable.
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

impl LossRecipe for SmoothAp {
    fn name(&self) -> String {
        "smooth_ap".into()
    }

    fn validate(&self) -> Result<()> {
        positive("tau", self.tau)
    }

    fn build(&self, _: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.clone()))
    }
}

impl RankLoss for SmoothAp {
    /// `1 − mean_q AP_q` over the queries with a positive.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        self.per_query(embeddings, labels)?.mean_loss()
    }
}

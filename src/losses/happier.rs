//! HAPPIER (Ramzi et al., ECCV 2022): the smooth H-AP loss `L^s_{H-AP}` (Eq. 5) and the full
//! objective `(1 − λ) L^s_{H-AP} + λ L_clust` (§3.3), with `L_clust` in
//! [`crate::losses::cluster`].
//!
//! Which pairs are smoothed (Table 7, supp. A.3), for a positive `k` and another item `j`:
//!
//! | pair                         | rank(k)            | H-rank(k)                      |
//! |------------------------------|--------------------|--------------------------------|
//! | `j` of lower level (Ω^<, negatives included) | `H_s^<` (Eq. 44) | exact `H` (weight `min(rel)`; 0 for negatives) |
//! | `j` of the same level        | exact `H`          | exact `H`                      |
//! | `j` of higher level (Ω^>)    | exact `H`          | `H_s^>` (Eq. 43) if `with_hrank`, else exact `H` |
//!
//! The exact steps have no gradient: `rank^≥`, `H-rank^≤` are "not optimised" (Table 7).
//! The paper optimises `H-rank^>` (`with_hrank = true`, our default); every configuration the
//! authors released for the paper's tables sets `with_hrank: False`, so that only `rank^<`
//! receives gradient ([`HapLoss::authors_code`]).
//!
//! Levels and relevances are computed *inside the batch*: the level of `j` for query `q` is
//! [`Labels::level`], and `rel` is [`Relevance`] (Eq. 4 by default) from the populations of the
//! levels in the batch.

use crate::error::{Error, Result};
use crate::hierarchy::{Labels, Relevance};
use crate::losses::cluster::ClusterLoss;
use crate::losses::config::{positive, LossContext, LossRecipe};
use crate::losses::norm_softmax::NormSoftmaxConfig;
use crate::losses::smooth_rank::{
    similarity_matrix, smooth_average_precision, Engine, PairSurrogates, QueryAp, RankProblem,
};
use crate::losses::surrogate::{Heaviside, LowerStep, UpperStep};
use crate::losses::{check_batch, RankLoss};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// HAPPIER's smooth H-AP loss `L^s_{H-AP} = 1 − mean_q H-AP_s(q)` (Eq. 5), an upper bound of
/// `1 − mH-AP` for the paper's surrogates.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::happier::HapLoss;
/// use rankwise::losses::smooth_rank::{similarity_matrix, smooth_average_precision, Engine, PairSurrogates, RankProblem};
/// use rankwise::losses::surrogate::Heaviside;
/// use rankwise::losses::RankLoss;
/// use rankwise::Labels;
/// // Two levels, finest first: fine classes {0, 1}, {2}, {3}; coarse classes {0, 1, 2}, {3}.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::new(vec![vec![0, 0], vec![0, 0], vec![1, 0], vec![2, 1]])?;
/// let loss = HapLoss::default();
/// let smooth = loss.forward(&x, &labels)?.to_scalar::<f64>()?;
/// // The same ranker with the exact step everywhere gives the exact H-AP.
/// let problem = RankProblem::hierarchical(&labels, loss.include_self, &loss.relevance)?;
/// let exact = PairSurrogates::uniform(Heaviside::default().into());
/// let scores = similarity_matrix(&x, true)?;
/// let hap = smooth_average_precision(&scores, &problem, &exact, Engine::Streaming, None)?;
/// let exact_loss = hap.mean_loss()?.to_scalar::<f64>()?;
/// // Eq. 5's surrogates bound H-rank from below and rank from above: L_s ≥ 1 − H-AP.
/// assert!(smooth >= exact_loss && exact_loss > 0.0);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HapLoss {
    /// Relevance of each level (Eq. 4: `Pop { alpha: 1, count_query: false }` by default;
    /// HAPPIER_F trains with α = 5 on SOP and 3 on iNaturalist).
    pub relevance: Relevance,
    /// `H_s^<` on lower-level pairs in `rank` (τ = 0.01, ρ = 100, δ = 0.05).
    pub rank_lower: UpperStep,
    /// `H_s^>` on higher-level pairs in `H-rank` (γ = 10, ν = 25, μ = 0.5), if `with_hrank`.
    pub hrank_higher: LowerStep,
    /// Smooth `H-rank^>` (paper: true). `false`: exact `H-rank`, no gradient through it (the
    /// authors' released configs).
    pub with_hrank: bool,
    /// The exact step used on every other pair (`H(0) = 1` as in the code).
    pub heaviside: Heaviside,
    /// The query as an item of its own retrieval set (authors' code: true; paper: false).
    pub include_self: bool,
    /// L2-normalise the embeddings first (cosine similarities).
    pub normalize: bool,
    /// Computation engine (same values and gradients).
    pub engine: Engine,
    /// Queries per chunk (`None` = all at once); changes memory only.
    pub query_chunk: Option<usize>,
}

impl Default for HapLoss {
    /// The paper: Eq. (4) relevance with α = 1, the query not in its own retrieval set, the
    /// continuous `H_s^<`, and `H-rank^>` optimised with `H_s^>`.
    fn default() -> Self {
        HapLoss {
            relevance: Relevance::Pop {
                alpha: HapLoss::PAPER_ALPHA,
                count_query: false,
            },
            rank_lower: UpperStep::default(),
            hrank_higher: LowerStep::default(),
            with_hrank: true,
            heaviside: Heaviside::default(),
            include_self: false,
            normalize: true,
            engine: Engine::Streaming,
            query_chunk: None,
        }
    }
}

impl HapLoss {
    /// The relevance exponent α of the paper's experiments (Eq. 4).
    pub const PAPER_ALPHA: f64 = 1.0;

    /// The authors' `HAPLoss` as configured for SOP (`HAPPIER_SOP.yaml`): the query in its own
    /// retrieval set and counted in the population of its fine class, `offset = 1.44`,
    /// `with_hrank = false`. Use [`UpperStep::inat_code`] for their iNaturalist configs.
    pub fn authors_code() -> Self {
        HapLoss {
            relevance: Relevance::Pop {
                alpha: 1.0,
                count_query: true,
            },
            rank_lower: UpperStep::sop_code(),
            hrank_higher: LowerStep {
                origin_in_leak: true,
                ..LowerStep::default()
            },
            with_hrank: false,
            include_self: true,
            ..Self::default()
        }
    }

    /// HAPPIER_F: the same loss with a larger relevance exponent α (> 1), which favours the
    /// fine levels (α = 5 on SOP, 3 on iNaturalist).
    pub fn happier_f(alpha: f64) -> Self {
        HapLoss {
            relevance: Relevance::Pop {
                alpha,
                count_query: false,
            },
            ..Self::default()
        }
    }

    /// The pair surrogates of the table in the module documentation.
    pub fn surrogates(&self) -> PairSurrogates {
        let h = self.heaviside.into();
        let higher = if self.with_hrank {
            self.hrank_higher.into()
        } else {
            h
        };
        PairSurrogates {
            rank: [self.rank_lower.into(), h, h],
            hrank: [h, h, higher],
        }
    }

    /// Smooth H-AP of every query (before `1 − mean`), differentiable.
    pub fn per_query(&self, embeddings: &Tensor, labels: &Labels) -> Result<QueryAp> {
        check_batch(embeddings, labels)?;
        let scores = similarity_matrix(embeddings, self.normalize)?;
        let problem = RankProblem::hierarchical(labels, self.include_self, &self.relevance)?;
        smooth_average_precision(
            &scores,
            &problem,
            &self.surrogates(),
            self.engine,
            self.query_chunk,
        )
    }
}

impl RankLoss for HapLoss {
    /// `1 − mean_q H-AP_s(q)` over the queries with a positive (an item sharing at least the
    /// coarsest label).
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        self.per_query(embeddings, labels)?.mean_loss()
    }
}

/// The HAPPIER objective `(1 − λ) L^s_{H-AP} + λ L_clust` (§3.3, λ = 0.1). The proxies of the
/// clustering loss are a candle `Var` ([`ClusterLoss::proxies`]) to give to an optimizer (the
/// authors give them their own Adam, lr 10 on SOP).
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use rankwise::losses::cluster::ClusterLoss;
/// use rankwise::losses::happier::{HapLoss, Happier};
/// use rankwise::losses::RankLoss;
/// use rankwise::Labels;
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::new(vec![vec![0, 0], vec![0, 0], vec![1, 0], vec![2, 1]])?;
/// let cluster = ClusterLoss::for_level(&labels, 0, 2, 0, DType::F64, &Device::Cpu)?;
/// let happier = Happier::new(HapLoss::default(), cluster.clone());
/// let parts = 0.9 * HapLoss::default().forward(&x, &labels)?.to_scalar::<f64>()?
///     + 0.1 * cluster.forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((happier.forward(&x, &labels)?.to_scalar::<f64>()? - parts).abs() < 1e-12);
/// // The proxies are the loss's own parameters, for the optimizer.
/// assert_eq!(happier.trainable_vars().len(), 1);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Happier {
    /// The smooth H-AP loss.
    pub hap: HapLoss,
    /// The clustering loss over fine-class proxies.
    pub cluster: ClusterLoss,
    /// λ ∈ [0, 1] (0.1 in the paper; 0.5 in the authors' DyML-Animal config).
    pub lambda: f64,
}

impl Happier {
    /// The paper's weight λ of the clustering loss (§3.3).
    pub const PAPER_LAMBDA: f64 = 0.1;

    /// HAPPIER with the paper's λ = 0.1.
    pub fn new(hap: HapLoss, cluster: ClusterLoss) -> Self {
        Happier {
            hap,
            cluster,
            lambda: Self::PAPER_LAMBDA,
        }
    }
}

impl RankLoss for Happier {
    /// The clustering loss's proxies, named `cluster.proxies`.
    fn trainable_vars(&self) -> Vec<(String, candle_core::Var)> {
        self.cluster
            .trainable_vars()
            .into_iter()
            .map(|(name, var)| (format!("cluster.{name}"), var))
            .collect()
    }

    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&self.lambda) {
            return Err(Error::invalid(
                "lambda",
                format!("must be in [0, 1], got {}", self.lambda),
            ));
        }
        let hap = self.hap.forward(embeddings, labels)?;
        let clust = self.cluster.forward(embeddings, labels)?;
        Ok(((hap * (1.0 - self.lambda))? + (clust * self.lambda)?)?)
    }
}

/// The relevance function HAPPIER trains with, as a recipe names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelevanceKind {
    /// HAPPIER Eq. (4), `(l/L)^α / |Ω^(l)|`.
    Pop,
    /// ΣwAP (supp. A.2, Property 1) with weights `(l/L)^α`, normalised to sum to 1.
    WeightedAp,
}

/// HAPPIER's recipe (`[loss] kind = "happier"`): the hyperparameters of [`HapLoss`], of the
/// clustering term and its weight λ. A recipe of its own because the clustering proxies are
/// drawn for the run's classes; its `Default` reads the paper's values from the loss types.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HappierConfig {
    /// Relevance exponent α (paper: 1; HAPPIER_F: 5 on SOP, 3 on iNaturalist).
    pub alpha: f64,
    /// Relevance function (Table 6 compares the two).
    pub relevance: RelevanceKind,
    /// Weight λ of the clustering loss (paper: 0.1; 0 trains `L^s_{H-AP}` alone, Table 5).
    pub lambda: f64,
    /// Temperature σ of the clustering loss (Eq. 6; the code's 0.05).
    pub cluster_temperature: f64,
    /// Optimise `H-rank^>` with the smooth lower step (paper: true; the released configs: false).
    pub with_hrank: bool,
    /// The query in its own retrieval set (authors' code: true; paper: false).
    pub include_self: bool,
}

impl Default for HappierConfig {
    fn default() -> Self {
        let hap = HapLoss::default();
        HappierConfig {
            alpha: HapLoss::PAPER_ALPHA,
            relevance: RelevanceKind::Pop,
            lambda: Happier::PAPER_LAMBDA,
            cluster_temperature: ClusterLoss::PAPER_TEMPERATURE,
            with_hrank: hap.with_hrank,
            include_self: hap.include_self,
        }
    }
}

impl LossRecipe for HappierConfig {
    fn name(&self) -> String {
        "happier".into()
    }

    fn validate(&self) -> Result<()> {
        positive("alpha", self.alpha)?;
        positive("cluster_temperature", self.cluster_temperature)?;
        if !(0.0..=1.0).contains(&self.lambda) {
            return Err(Error::invalid(
                "loss.lambda",
                format!("must be in [0, 1], got {}", self.lambda),
            ));
        }
        Ok(())
    }

    /// `L^s_{H-AP}` alone when λ = 0; otherwise HAPPIER with one clustering proxy per fine
    /// training class, drawn from the run's seed.
    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        let relevance = match self.relevance {
            RelevanceKind::Pop => Relevance::Pop {
                alpha: self.alpha,
                count_query: self.include_self,
            },
            RelevanceKind::WeightedAp => Relevance::WeightedAp {
                weights: weighted_ap_weights(ctx.train_labels.num_levels(), self.alpha),
            },
        };
        let hap = HapLoss {
            relevance,
            with_hrank: self.with_hrank,
            include_self: self.include_self,
            ..HapLoss::default()
        };
        if self.lambda == 0.0 {
            return Ok(Box::new(hap));
        }
        let cluster = NormSoftmaxConfig {
            temperature: self.cluster_temperature,
            margin: 0.0,
        }
        .loss(ctx)?;
        let mut happier = Happier::new(hap, cluster);
        happier.lambda = self.lambda;
        Ok(Box::new(happier))
    }
}

/// ΣwAP weights `w_l ∝ (l/L)^α`, `l = 1..L`, normalised to sum to 1 (HAPPIER supp. A.2: with
/// these weights ΣwAP and H-AP give the same importance to each level).
pub(crate) fn weighted_ap_weights(num_levels: usize, alpha: f64) -> Vec<f64> {
    let l = num_levels as f64;
    let raw: Vec<f64> = (1..=num_levels)
        .map(|p| (p as f64 / l).powf(alpha))
        .collect();
    let total: f64 = raw.iter().sum();
    raw.into_iter().map(|w| w / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_ap_weights_sum_to_one_and_grow_with_the_level() {
        let w = weighted_ap_weights(3, 1.0);
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        assert!((w[0] - 1.0 / 6.0).abs() < 1e-15 && (w[2] - 0.5).abs() < 1e-15);
    }
}

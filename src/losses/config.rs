//! A loss chosen by name in a TOML recipe (`[loss] kind = "smooth_ap"`), with the
//! hyperparameters that the papers' tables vary, and [`LossConfig::build`] that turns it into a
//! [`RankLoss`] for a given training set.
//!
//! Every variant's defaults are the paper's settings (the same as the loss struct's `Default`);
//! the options that switch to the authors' code are named after it. Losses with learnable
//! parameters (the proxies of HAPPIER's clustering term and of the normalised softmax) need the
//! training labels and the embedding dimension to be built; their variables are returned by
//! [`RankLoss::trainable_vars`] and trained by the `train` module in their own parameter group.

use crate::error::{Error, Result};
use crate::hierarchy::{Labels, Relevance};
use crate::losses::cluster::ClusterLoss;
use crate::losses::contrastive::Contrastive;
use crate::losses::fastap::{FastAp, FastApGradient};
use crate::losses::happier::{HapLoss, Happier};
use crate::losses::norm_softmax::NormSoftmax;
use crate::losses::pairwise_rows::PairMetric;
use crate::losses::rambo::{MarginMode, Rambo, RamboObjective, RamboWithMemory, RecallWeight};
use crate::losses::roadmap::{Roadmap, SupAp};
use crate::losses::smooth_ap::SmoothAp;
use crate::losses::summed_levels::{LevelTerm, SummedLevels};
use crate::losses::triplet::{Triplet, TripletMining};
use crate::losses::RankLoss;
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

/// Which loss to train with, and its hyperparameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LossConfig {
    /// Smooth-AP (Brown et al., Eq. 7).
    SmoothAp(SmoothApConfig),
    /// FastAP (Cakir et al., histogram AP).
    FastAp(FastApConfig),
    /// RaMBO (Rolínek et al.): blackbox-differentiated AP or recall loss.
    Rambo(RamboConfig),
    /// HAPPIER (Ramzi et al., §3.3): `(1 − λ) L^s_{H-AP} + λ L_clust`.
    Happier(HappierConfig),
    /// ROADMAP / SupAP (Ramzi et al., NeurIPS 2021), a baseline of HAPPIER's tables.
    Roadmap(RoadmapConfig),
    /// Contrastive loss with margins on cosine similarities.
    Contrastive(ContrastiveConfig),
    /// Triplet margin loss with mining (TL_SH of HAPPIER's tables).
    Triplet(TripletConfig),
    /// Normalised softmax over learnable class proxies (NSM).
    NormSoftmax(NormSoftmaxConfig),
    /// The "Σ" hierarchical baselines: the same flat loss at every level, summed.
    Summed(SummedConfig),
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig::SmoothAp(SmoothApConfig::default())
    }
}

/// Smooth-AP's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmoothApConfig {
    /// Sigmoid temperature τ (paper: 0.01).
    pub tau: f64,
    /// The query in its own ranking (authors' code: true; paper: false).
    pub include_self: bool,
}

impl Default for SmoothApConfig {
    fn default() -> Self {
        let d = SmoothAp::default();
        SmoothApConfig {
            tau: d.tau,
            include_self: d.include_self,
        }
    }
}

/// FastAP's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FastApConfig {
    /// Number of histogram intervals over `[0, 4]` (authors: 10).
    pub num_bins: usize,
    /// The authors' hand-written backward (`N_valid/2` × the exact gradient) instead of the exact
    /// gradient of the paper's objective.
    pub authors_gradient: bool,
}

impl Default for FastApConfig {
    fn default() -> Self {
        FastApConfig {
            num_bins: FastAp::default().num_bins,
            authors_gradient: false,
        }
    }
}

/// The metric RaMBO optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RamboMetric {
    /// `1 − AP` (Eq. 21–22).
    Ap,
    /// The recall loss with `ℓ(k) = log(1 + k)` ("RaMBO log").
    RecallLog,
    /// The recall loss with `ℓ(k) = log(1 + log(1 + k))` ("RaMBO log log").
    RecallLogLog,
}

/// RaMBO's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RamboConfig {
    /// The optimised metric (default: recall log log, the paper's best on SOP/CUB).
    pub metric: RamboMetric,
    /// Interpolation strength λ of the blackbox gradient (Eq. 10; paper: 4).
    pub lambda: f64,
    /// Margin α on normalised ranks (Eq. 14; 0 disables it; paper: 0.02).
    pub margin: f64,
    /// The authors' `MapLoss` margin `α·|ξ|`, `ξ ~ N(0, 1)` (seeded), instead of the paper's
    /// deterministic one.
    pub half_normal_margin: bool,
    /// Score memory: the number τ of past batches whose detached scores join the ranking
    /// (Sec. 4.3; 0 = no memory).
    pub memory: usize,
}

impl Default for RamboConfig {
    fn default() -> Self {
        let d = Rambo::default();
        RamboConfig {
            metric: RamboMetric::RecallLogLog,
            lambda: d.lambda,
            margin: d.margin,
            half_normal_margin: false,
            memory: 0,
        }
    }
}

/// The relevance function HAPPIER trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelevanceKind {
    /// HAPPIER Eq. (4), `(l/L)^α / |Ω^(l)|`.
    Pop,
    /// ΣwAP (supp. A.2, Property 1) with weights `(l/L)^α`, normalised to sum to 1.
    WeightedAp,
}

/// HAPPIER's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HappierConfig {
    /// Relevance exponent α (paper: 1; HAPPIER_F: 5 on SOP, 3 on iNaturalist).
    pub alpha: f64,
    /// Relevance function (Table 6 compares the two).
    pub relevance: RelevanceKind,
    /// Weight λ of the clustering loss (paper: 0.1; 0 trains `L^s_{H-AP}` alone, Table 5).
    pub lambda: f64,
    /// Temperature σ of the clustering loss (Eq. 6; paper: 0.05).
    pub cluster_temperature: f64,
    /// Optimise `H-rank^>` with the smooth lower step (paper: true; the released configs: false).
    pub with_hrank: bool,
    /// The query in its own retrieval set (authors' code: true; paper: false).
    pub include_self: bool,
}

impl Default for HappierConfig {
    fn default() -> Self {
        HappierConfig {
            alpha: 1.0,
            relevance: RelevanceKind::Pop,
            lambda: 0.1,
            cluster_temperature: 0.05,
            with_hrank: true,
            include_self: false,
        }
    }
}

/// ROADMAP's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoadmapConfig {
    /// Weight of SupAP.
    pub sup_ap_weight: f64,
    /// Weight of the calibration loss (0: SupAP alone).
    pub calibration_weight: f64,
}

impl Default for RoadmapConfig {
    fn default() -> Self {
        let d = Roadmap::default();
        RoadmapConfig {
            sup_ap_weight: d.sup_ap_weight,
            calibration_weight: d.calibration_weight,
        }
    }
}

/// Contrastive-loss hyperparameters (cosine similarities).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContrastiveConfig {
    /// Positive margin: positives with similarity below it are pulled.
    pub pos_margin: f64,
    /// Negative margin: negatives with similarity above it are pushed.
    pub neg_margin: f64,
}

impl Default for ContrastiveConfig {
    fn default() -> Self {
        let d = Contrastive::default();
        ContrastiveConfig {
            pos_margin: d.pos_margin,
            neg_margin: d.neg_margin,
        }
    }
}

/// Triplet-loss hyperparameters (cosine similarities).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TripletConfig {
    /// Margin.
    pub margin: f64,
    /// Mining: `easy_positive_semi_hard_negative` (TL_SH), `semi_hard` or `all`.
    pub mining: MiningKind,
}

/// Triplet mining, as named in a recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MiningKind {
    /// Every triplet.
    All,
    /// FaceNet's semi-hard triplets.
    SemiHard,
    /// Easy positive, semi-hard negative (SupRank's TL_SH).
    EasyPositiveSemiHardNegative,
}

impl Default for TripletConfig {
    fn default() -> Self {
        TripletConfig {
            margin: Triplet::default().margin,
            mining: MiningKind::EasyPositiveSemiHardNegative,
        }
    }
}

/// Normalised-softmax hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormSoftmaxConfig {
    /// Temperature σ (authors' code: 0.05).
    pub temperature: f64,
}

impl Default for NormSoftmaxConfig {
    fn default() -> Self {
        NormSoftmaxConfig { temperature: 0.05 }
    }
}

/// A flat loss summed over hierarchy levels with weight 1 each (HAPPIER's Σ baselines).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummedConfig {
    /// The flat loss applied at each level.
    pub base: Box<LossConfig>,
    /// The levels (0 = finest); default every level of the labels.
    #[serde(default)]
    pub levels: Option<Vec<usize>>,
}

/// What [`LossConfig::build`] needs to know about the training run.
#[derive(Debug, Clone)]
pub struct LossContext<'a> {
    /// The training labels (proxy losses get one proxy per class).
    pub train_labels: &'a Labels,
    /// The embedding dimension.
    pub dim: usize,
    /// Seed of the proxies and of random margins.
    pub seed: u64,
    /// Device of the proxies.
    pub device: &'a Device,
}

impl LossConfig {
    /// A short name for tables and logs, e.g. `smooth_ap`, `sum(triplet)`.
    pub fn name(&self) -> String {
        match self {
            LossConfig::SmoothAp(_) => "smooth_ap".into(),
            LossConfig::FastAp(_) => "fastap".into(),
            LossConfig::Rambo(_) => "rambo".into(),
            LossConfig::Happier(_) => "happier".into(),
            LossConfig::Roadmap(_) => "roadmap".into(),
            LossConfig::Contrastive(_) => "contrastive".into(),
            LossConfig::Triplet(_) => "triplet".into(),
            LossConfig::NormSoftmax(_) => "norm_softmax".into(),
            LossConfig::Summed(s) => format!("sum({})", s.base.name()),
        }
    }

    /// Errors naming the first invalid hyperparameter (`loss.<field>`).
    pub fn validate(&self) -> Result<()> {
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::invalid(
                    format!("loss.{field}"),
                    format!("must be finite and > 0, got {v}"),
                ))
            }
        };
        let finite = |field: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(Error::invalid(
                    format!("loss.{field}"),
                    format!("must be finite, got {v}"),
                ))
            }
        };
        match self {
            LossConfig::SmoothAp(c) => positive("tau", c.tau),
            LossConfig::FastAp(c) => {
                if c.num_bins == 0 {
                    return Err(Error::invalid("loss.num_bins", "must be ≥ 1"));
                }
                Ok(())
            }
            LossConfig::Rambo(c) => {
                positive("lambda", c.lambda)?;
                finite("margin", c.margin)
            }
            LossConfig::Happier(c) => {
                positive("alpha", c.alpha)?;
                positive("cluster_temperature", c.cluster_temperature)?;
                if !(0.0..=1.0).contains(&c.lambda) {
                    return Err(Error::invalid(
                        "loss.lambda",
                        format!("must be in [0, 1], got {}", c.lambda),
                    ));
                }
                Ok(())
            }
            LossConfig::Roadmap(c) => {
                finite("sup_ap_weight", c.sup_ap_weight)?;
                finite("calibration_weight", c.calibration_weight)
            }
            LossConfig::Contrastive(c) => {
                finite("pos_margin", c.pos_margin)?;
                finite("neg_margin", c.neg_margin)
            }
            LossConfig::Triplet(c) => finite("margin", c.margin),
            LossConfig::NormSoftmax(c) => positive("temperature", c.temperature),
            LossConfig::Summed(s) => {
                if matches!(*s.base, LossConfig::Summed(_)) {
                    return Err(Error::invalid(
                        "loss.base",
                        "a Σ loss cannot nest another Σ",
                    ));
                }
                if s.levels.as_ref().is_some_and(|l| l.is_empty()) {
                    return Err(Error::invalid("loss.levels", "list at least one level"));
                }
                s.base.validate()
            }
        }
    }

    /// The loss for a training run. Proxy losses get one proxy per class of the training
    /// labels (at the level they work on), drawn from `ctx.seed`.
    pub fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        self.validate()?;
        Ok(match self {
            LossConfig::SmoothAp(c) => Box::new(SmoothAp {
                tau: c.tau,
                include_self: c.include_self,
                ..SmoothAp::default()
            }),
            LossConfig::FastAp(c) => Box::new(FastAp {
                num_bins: c.num_bins,
                gradient: if c.authors_gradient {
                    FastApGradient::AuthorsPort
                } else {
                    FastApGradient::Exact
                },
                ..FastAp::default()
            }),
            LossConfig::Rambo(c) => {
                let rambo = Rambo {
                    objective: match c.metric {
                        RamboMetric::Ap => RamboObjective::Ap,
                        RamboMetric::RecallLog => RamboObjective::Recall(RecallWeight::Log),
                        RamboMetric::RecallLogLog => RamboObjective::Recall(RecallWeight::LogLog),
                    },
                    lambda: c.lambda,
                    margin: c.margin,
                    margin_mode: if c.half_normal_margin {
                        MarginMode::HalfNormal { seed: ctx.seed }
                    } else {
                        MarginMode::Deterministic
                    },
                    ..Rambo::default()
                };
                if c.memory > 0 {
                    Box::new(RamboWithMemory::new(rambo, c.memory))
                } else {
                    Box::new(rambo)
                }
            }
            LossConfig::Happier(c) => {
                let relevance = match c.relevance {
                    RelevanceKind::Pop => Relevance::Pop {
                        alpha: c.alpha,
                        count_query: c.include_self,
                    },
                    RelevanceKind::WeightedAp => Relevance::WeightedAp {
                        weights: weighted_ap_weights(ctx.train_labels.num_levels(), c.alpha),
                    },
                };
                let hap = HapLoss {
                    relevance,
                    with_hrank: c.with_hrank,
                    include_self: c.include_self,
                    ..HapLoss::default()
                };
                if c.lambda == 0.0 {
                    Box::new(hap)
                } else {
                    let mut classes = ctx.train_labels.column(0);
                    classes.sort_unstable();
                    classes.dedup();
                    let mut cluster =
                        ClusterLoss::new(&classes, ctx.dim, ctx.seed, DType::F32, ctx.device)?;
                    cluster.temperature = c.cluster_temperature;
                    let mut happier = Happier::new(hap, cluster);
                    happier.lambda = c.lambda;
                    Box::new(happier)
                }
            }
            LossConfig::Roadmap(c) => Box::new(Roadmap {
                sup_ap: SupAp::default(),
                sup_ap_weight: c.sup_ap_weight,
                calibration_weight: c.calibration_weight,
                ..Roadmap::default()
            }),
            LossConfig::Contrastive(c) => Box::new(Contrastive {
                pos_margin: c.pos_margin,
                neg_margin: c.neg_margin,
                metric: PairMetric::Cosine,
                ..Contrastive::default()
            }),
            LossConfig::Triplet(c) => Box::new(Triplet {
                margin: c.margin,
                mining: match c.mining {
                    MiningKind::All => TripletMining::All,
                    MiningKind::SemiHard => TripletMining::SemiHard,
                    MiningKind::EasyPositiveSemiHardNegative => {
                        TripletMining::EasyPositiveSemiHardNegative
                    }
                },
                ..Triplet::default()
            }),
            LossConfig::NormSoftmax(c) => {
                let mut nsm = NormSoftmax::for_level(
                    ctx.train_labels,
                    0,
                    ctx.dim,
                    ctx.seed,
                    DType::F32,
                    ctx.device,
                )?;
                nsm.temperature = c.temperature;
                Box::new(nsm)
            }
            LossConfig::Summed(s) => {
                let num_levels = ctx.train_labels.num_levels();
                let levels = s
                    .levels
                    .clone()
                    .unwrap_or_else(|| (0..num_levels).collect());
                let mut terms = Vec::with_capacity(levels.len());
                for (i, &level) in levels.iter().enumerate() {
                    if level >= num_levels {
                        return Err(Error::invalid(
                            "loss.levels",
                            format!("level {level} does not exist (labels have {num_levels})"),
                        ));
                    }
                    // Each level has its own loss instance; proxy losses get the classes of
                    // that level and their own seed.
                    let coarse = ctx.train_labels.coarsen(level)?;
                    let level_ctx = LossContext {
                        train_labels: &coarse,
                        seed: ctx.seed.wrapping_add(i as u64 + 1),
                        ..ctx.clone()
                    };
                    terms.push(LevelTerm {
                        level,
                        weight: 1.0,
                        loss: s.base.build(&level_ctx)?,
                    });
                }
                Box::new(SummedLevels::new(terms)?)
            }
        })
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
    use candle_core::Tensor;

    fn labels() -> Labels {
        // 12 items, 2 levels: fine class = i / 2, coarse = i / 6.
        Labels::new((0..12).map(|i| vec![i / 2, i / 6]).collect()).unwrap()
    }

    fn ctx<'a>(labels: &'a Labels, device: &'a Device) -> LossContext<'a> {
        LossContext {
            train_labels: labels,
            dim: 8,
            seed: 3,
            device,
        }
    }

    fn every_kind() -> Vec<LossConfig> {
        vec![
            LossConfig::SmoothAp(SmoothApConfig::default()),
            LossConfig::FastAp(FastApConfig::default()),
            LossConfig::Rambo(RamboConfig::default()),
            LossConfig::Rambo(RamboConfig {
                metric: RamboMetric::Ap,
                memory: 2,
                ..RamboConfig::default()
            }),
            LossConfig::Happier(HappierConfig::default()),
            LossConfig::Happier(HappierConfig {
                relevance: RelevanceKind::WeightedAp,
                lambda: 0.0,
                ..HappierConfig::default()
            }),
            LossConfig::Roadmap(RoadmapConfig::default()),
            LossConfig::Contrastive(ContrastiveConfig::default()),
            LossConfig::Triplet(TripletConfig::default()),
            LossConfig::NormSoftmax(NormSoftmaxConfig::default()),
            LossConfig::Summed(SummedConfig {
                base: Box::new(LossConfig::NormSoftmax(NormSoftmaxConfig::default())),
                levels: None,
            }),
        ]
    }

    #[test]
    fn every_kind_builds_runs_and_round_trips_through_toml() {
        let labels = labels();
        let device = Device::Cpu;
        let e = Tensor::randn(0f32, 1.0, (12, 8), &device).unwrap();
        for config in every_kind() {
            #[derive(Serialize, Deserialize)]
            struct Wrapper {
                loss: LossConfig,
            }
            let text = toml::to_string(&Wrapper {
                loss: config.clone(),
            })
            .unwrap();
            let back: Wrapper = toml::from_str(&text).unwrap();
            assert_eq!(back.loss, config, "{text}");
            let loss = config.build(&ctx(&labels, &device)).unwrap();
            let v = loss.forward(&e, &labels).unwrap();
            let v = v.to_scalar::<f32>().unwrap();
            assert!(v.is_finite(), "{}: {v}", config.name());
            let proxies = !loss.trainable_vars().is_empty();
            let expect = matches!(
                &config,
                LossConfig::Happier(HappierConfig { lambda, .. }) if *lambda > 0.0
            ) || matches!(&config, LossConfig::NormSoftmax(_) | LossConfig::Summed(_));
            assert_eq!(proxies, expect, "{}", config.name());
        }
    }

    #[test]
    fn summed_norm_softmax_has_one_proxy_set_per_level() {
        let labels = labels();
        let device = Device::Cpu;
        let config = LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::NormSoftmax(NormSoftmaxConfig::default())),
            levels: None,
        });
        let loss = config.build(&ctx(&labels, &device)).unwrap();
        let vars = loss.trainable_vars();
        assert_eq!(vars.len(), 2);
        // 6 fine classes and 2 coarse classes.
        assert_eq!(vars[0].1.dims(), &[6, 8]);
        assert_eq!(vars[1].1.dims(), &[2, 8]);
        assert_ne!(vars[0].0, vars[1].0, "names must be distinct");
    }

    #[test]
    fn toml_names_the_bad_field() {
        let e = toml::from_str::<LossConfig>("kind = \"smooth_ap\"\ntaux = 0.1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("taux"), "{e}");
        let e = toml::from_str::<LossConfig>("kind = \"smoothap\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("smoothap"), "{e}");
        let bad = LossConfig::SmoothAp(SmoothApConfig {
            tau: 0.0,
            ..SmoothApConfig::default()
        });
        assert!(bad.validate().unwrap_err().to_string().contains("loss.tau"));
        let nested = LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::Summed(SummedConfig {
                base: Box::new(LossConfig::default()),
                levels: None,
            })),
            levels: None,
        });
        assert!(nested.validate().is_err());
        let labels = labels();
        let device = Device::Cpu;
        let missing_level = LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::default()),
            levels: Some(vec![0, 5]),
        });
        let e = match missing_level.build(&ctx(&labels, &device)) {
            Ok(_) => panic!("level 5 of 2 levels must be an error"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("level 5"), "{e}");
    }

    #[test]
    fn weighted_ap_weights_sum_to_one_and_grow_with_the_level() {
        let w = weighted_ap_weights(3, 1.0);
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        assert!((w[0] - 1.0 / 6.0).abs() < 1e-15 && (w[2] - 0.5).abs() < 1e-15);
    }
}

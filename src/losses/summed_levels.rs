//! The "Σ" hierarchical baselines of HAPPIER's tables (Sec. 4.1, Tables 1–2: Σ TL_SH, Σ NSM,
//! Σ NCA++): a flat loss applied at every level of the hierarchy and summed,
//!
//! `L_Σ = Σ_l w_l · L(embeddings, labels at level l)`,
//!
//! where "labels at level l" are `labels.coarsen(l)` — the classes of level `l` become the fine
//! classes, so items of the same level-`l` class are positives. The papers do not give the
//! weights; the authors' code (SupRank `triplet_triple.yaml`, `norm_softmax_triple.yaml`) lists
//! one loss per level with no weight, i.e. all weights 1, the default of
//! [`SummedLevels::uniform`].

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::config::{LossContext, LossRecipe};
use crate::losses::{LossConfig, RankLoss};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// One term of a [`SummedLevels`] loss.
pub struct LevelTerm {
    /// The hierarchy level the term is computed at (0 = finest).
    pub level: usize,
    /// Its weight `w_l` (finite, ≥ 0).
    pub weight: f64,
    /// The flat loss (each level has its own instance, e.g. its own NSM proxies).
    pub loss: Box<dyn RankLoss>,
}

impl std::fmt::Debug for LevelTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LevelTerm")
            .field("level", &self.level)
            .field("weight", &self.weight)
            .finish_non_exhaustive()
    }
}

/// A weighted sum of flat losses over hierarchy levels (the Σ baselines).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::summed_levels::SummedLevels;
/// use rankwise::losses::{smooth_ap::SmoothAp, RankLoss};
/// use rankwise::Labels;
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::new(vec![vec![0, 0], vec![0, 0], vec![1, 0], vec![2, 1]])?;
/// // Σ Smooth-AP over the two levels: the fine term plus the term where positives share the
/// // coarse class.
/// let summed = SummedLevels::uniform(2, |_| Ok(Box::new(SmoothAp::default()) as Box<dyn RankLoss>))?;
/// let fine = SummedLevels::uniform(1, |_| Ok(Box::new(SmoothAp::default()) as Box<dyn RankLoss>))?;
/// let (both, one) = (summed.forward(&x, &labels)?.to_scalar::<f64>()?, fine.forward(&x, &labels)?.to_scalar::<f64>()?);
/// assert!(both > one);
/// assert!((one - SmoothAp::default().forward(&x, &labels)?.to_scalar::<f64>()?).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug)]
pub struct SummedLevels {
    terms: Vec<LevelTerm>,
}

impl SummedLevels {
    /// The sum of the given terms. Errors on no term or a negative or non-finite weight.
    pub fn new(terms: Vec<LevelTerm>) -> Result<Self> {
        if terms.is_empty() {
            return Err(Error::invalid("terms", "a Σ loss needs at least one level"));
        }
        if let Some(t) = terms
            .iter()
            .find(|t| !t.weight.is_finite() || t.weight < 0.0)
        {
            return Err(Error::invalid(
                "weight",
                format!(
                    "level {} has weight {}; weights must be finite and ≥ 0",
                    t.level, t.weight
                ),
            ));
        }
        Ok(SummedLevels { terms })
    }

    /// One term of weight 1 at each level `0..num_levels`, built by `make(level)`.
    pub fn uniform(
        num_levels: usize,
        mut make: impl FnMut(usize) -> Result<Box<dyn RankLoss>>,
    ) -> Result<Self> {
        let terms = (0..num_levels)
            .map(|level| {
                Ok(LevelTerm {
                    level,
                    weight: 1.0,
                    loss: make(level)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(terms)
    }

    /// The terms, in order.
    pub fn terms(&self) -> &[LevelTerm] {
        &self.terms
    }
}

impl RankLoss for SummedLevels {
    /// Every term's variables, named `term<i>.<name>`.
    fn trainable_vars(&self) -> Vec<(String, candle_core::Var)> {
        self.terms
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                t.loss
                    .trainable_vars()
                    .into_iter()
                    .map(move |(name, var)| (format!("term{i}.{name}"), var))
            })
            .collect()
    }

    /// The terms' states as a JSON array (`null` for a stateless term).
    fn state_json(&self) -> Result<Option<String>> {
        let states = self
            .terms
            .iter()
            .map(|t| t.loss.state_json())
            .collect::<Result<Vec<_>>>()?;
        if states.iter().all(Option::is_none) {
            return Ok(None);
        }
        serde_json::to_string(&states)
            .map(Some)
            .map_err(|e| Error::invalid("loss state", e.to_string()))
    }

    fn load_state_json(&self, json: &str) -> Result<()> {
        let states: Vec<Option<String>> = serde_json::from_str(json)
            .map_err(|e| Error::invalid("loss state", format!("not a Σ loss state: {e}")))?;
        if states.len() != self.terms.len() {
            return Err(Error::invalid(
                "loss state",
                format!(
                    "{} term states for {} terms",
                    states.len(),
                    self.terms.len()
                ),
            ));
        }
        for (term, state) in self.terms.iter().zip(states) {
            if let Some(s) = state {
                term.loss.load_state_json(&s)?;
            }
        }
        Ok(())
    }

    /// `Σ_l w_l · loss_l(embeddings, labels.coarsen(l))`. Errors if a term's level does not
    /// exist in `labels`; each term's own checks and conventions apply.
    ///
    /// A level at which the whole batch is one class has no negative pair, so its term adds
    /// nothing and is skipped: pytorch-metric-learning's losses (the authors' Σ) return zero for
    /// a batch without pairs or triplets, where ours would refuse it. It happens at the coarsest
    /// levels of a deep hierarchy, where two classes split the data (HAPPIER Table 4). Errors
    /// if every level is skipped.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        let mut total: Option<Tensor> = None;
        for term in &self.terms {
            if term.level >= labels.num_levels() {
                return Err(Error::invalid(
                    "level",
                    format!(
                        "the Σ loss has a term at level {} but the labels have {} levels",
                        term.level,
                        labels.num_levels()
                    ),
                ));
            }
            let coarse = labels.coarsen(term.level)?;
            let first = coarse.fine(0);
            if (1..coarse.len()).all(|i| coarse.fine(i) == first) {
                continue;
            }
            let value = (term.loss.forward(embeddings, &coarse)? * term.weight)?;
            total = Some(match total {
                None => value,
                Some(t) => (t + value)?,
            });
        }
        total.ok_or_else(|| {
            Error::invalid(
                "labels",
                "the Σ loss is undefined for this batch: it is one class at every level of the \
                 loss, so no level has a negative",
            )
        })
    }
}

/// The Σ baselines' recipe (`[loss] kind = "summed"`, `levels`, and `[loss.base]` the flat loss):
/// the base loss at each listed level with weight 1, each level its own instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummedConfig {
    /// The flat loss applied at each level.
    pub base: Box<LossConfig>,
    /// The levels (0 = finest); default every level of the labels.
    #[serde(default)]
    pub levels: Option<Vec<usize>>,
}

impl LossRecipe for SummedConfig {
    fn name(&self) -> String {
        format!("sum({})", self.base.name())
    }

    fn validate(&self) -> Result<()> {
        if matches!(*self.base, LossConfig::Summed(_)) {
            return Err(Error::invalid(
                "loss.base",
                "a Σ loss cannot nest another Σ",
            ));
        }
        if self.levels.as_ref().is_some_and(|l| l.is_empty()) {
            return Err(Error::invalid("loss.levels", "list at least one level"));
        }
        self.base.validate()
    }

    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        let num_levels = ctx.train_labels.num_levels();
        let levels = self
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
            // Each level has its own loss instance; proxy losses get the classes of that level
            // and their own seed.
            let coarse = ctx.train_labels.coarsen(level)?;
            let level_ctx = LossContext {
                train_labels: &coarse,
                seed: ctx.seed.wrapping_add(i as u64 + 1),
                ..ctx.clone()
            };
            terms.push(LevelTerm {
                level,
                weight: 1.0,
                loss: self.base.build(&level_ctx)?,
            });
        }
        Ok(Box::new(SummedLevels::new(terms)?))
    }
}

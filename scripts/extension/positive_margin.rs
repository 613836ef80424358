//! The example loss of `scripts/extension_check.sh` (issue #23: adding a loss touches two
//! files): a hinge on the cosine of every positive pair,
//!
//! `L = mean_{(i, j) positive, i ≠ j} max(0, m − cos(x_i, x_j))`,
//!
//! which pulls same-class embeddings together until their cosine reaches the margin `m`. It
//! is not a loss of the papers (it has no negatives, so it collapses); it is here to show the
//! whole of what a new loss needs: the loss, its recipe (this struct, with serde and the
//! `Default`), its validation and its build, and its tests. The check copies this file to
//! `src/losses/`, adds `pub mod positive_margin;` and one registry line to `losses/mod.rs`,
//! counts the files touched and runs the tests below.

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::config::{finite, LossContext, LossRecipe};
use crate::losses::{check_batch, l2_normalize, pair_masks, RankLoss};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

/// The positive-pair cosine hinge (see the module documentation); its own recipe
/// (`[loss] kind = "positive_margin"`, `margin`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PositiveMargin {
    /// The cosine `m` a positive pair is pulled up to.
    pub margin: f64,
}

impl Default for PositiveMargin {
    fn default() -> Self {
        PositiveMargin { margin: 1.0 }
    }
}

impl LossRecipe for PositiveMargin {
    fn name(&self) -> String {
        "positive_margin".into()
    }

    fn validate(&self) -> Result<()> {
        finite("margin", self.margin)
    }

    fn build(&self, _: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.clone()))
    }
}

impl RankLoss for PositiveMargin {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        let x = l2_normalize(embeddings, "embeddings")?;
        let cos = x.matmul(&x.t()?)?;
        // The positive pairs (same fine class, i ≠ j) as a 0 / 1 mask.
        let (mask, _) = pair_masks(labels, x.dtype(), x.device())?;
        let pairs = mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
        if pairs == 0.0 {
            return Err(Error::invalid("labels", "the batch has no positive pair"));
        }
        let hinge = (cos.affine(-1.0, self.margin)?.relu()? * mask)?;
        Ok((hinge.sum_all()? / pairs)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::LossConfig;
    use candle_core::{Device, Var};

    fn batch() -> (Tensor, Labels) {
        // Cosines s01 = s23 = 0.8 (the positive pairs), s13 = 0.96, s03 = s12 = 0.6.
        let x = Tensor::new(
            &[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]],
            &Device::Cpu,
        )
        .unwrap();
        (x, Labels::from_fine(&[0, 0, 1, 1]).unwrap())
    }

    #[test]
    fn hand_worked_value() {
        let (x, y) = batch();
        let loss = |m: f64| {
            PositiveMargin { margin: m }
                .forward(&x, &y)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        assert!((loss(1.0) - 0.2).abs() < 1e-12);
        assert!((loss(0.9) - 0.1).abs() < 1e-12);
        assert_eq!(loss(0.5), 0.0);
    }

    #[test]
    fn a_recipe_names_it_and_builds_it() {
        let config: LossConfig =
            toml::from_str("kind = \"positive_margin\"\nmargin = 0.9\n").unwrap();
        assert_eq!(config.name(), "positive_margin");
        let labels = Labels::from_fine(&[0, 0, 1, 1]).unwrap();
        let ctx = LossContext {
            train_labels: &labels,
            dim: 2,
            seed: 0,
            device: &Device::Cpu,
        };
        let (x, y) = batch();
        let v = config.build(&ctx).unwrap().forward(&x, &y).unwrap();
        assert!((v.to_scalar::<f64>().unwrap() - 0.1).abs() < 1e-12);
        let bad: LossConfig = toml::from_str("kind = \"positive_margin\"\nmargin = nan\n").unwrap();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("loss.margin"));
    }

    #[test]
    fn the_gradient_pulls_positives_together() {
        let (x, y) = batch();
        let var = Var::from_tensor(&x).unwrap();
        let loss = PositiveMargin::default()
            .forward(var.as_tensor(), &y)
            .unwrap();
        let grads = loss.backward().unwrap();
        let g = grads.get(&var).unwrap().to_vec2::<f64>().unwrap();
        // Item 0 = (1, 0) is pulled towards item 1 = (0.8, 0.6): descent raises its y.
        assert!(g[0][1] < 0.0, "{g:?}");
        assert!(g.iter().flatten().all(|v| v.is_finite()));
    }
}

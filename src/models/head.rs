//! The embedding head of the papers' code (HAPPIER / ROADMAP / SupRank `RetrievalNet`):
//! global pooling → optional `LayerNorm` without affine parameters → linear to `D` → L2
//! normalisation.

use super::layers::{
    apply_linear, global_pool, l2_normalize, layer_norm_no_affine, linear, Pooling,
};
use crate::error::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

/// Configuration of [`EmbeddingHead`] (without the input width, which the backbone gives).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingHeadConfig {
    /// Embedding dimension `D` (512 in every paper).
    pub dim: usize,
    /// Global pooling of the feature map.
    pub pooling: Pooling,
    /// `LayerNorm(C, elementwise_affine=False)` before the linear layer (HAPPIER
    /// `norm_features: True`, the `resnet_ln` models).
    pub layer_norm: bool,
    /// L2-normalise the output (`F.normalize`), as every paper's model does.
    pub normalize: bool,
}

impl Default for EmbeddingHeadConfig {
    /// HAPPIER's `resnet_ln`: average pooling, LayerNorm, 512, L2-normalised.
    fn default() -> Self {
        EmbeddingHeadConfig {
            dim: 512,
            pooling: Pooling::Avg,
            layer_norm: true,
            normalize: true,
        }
    }
}

/// The embedding head. Its linear layer is named `fc.weight` / `fc.bias`.
#[derive(Debug, Clone)]
pub struct EmbeddingHead {
    config: EmbeddingHeadConfig,
    fc: candle_nn::Linear,
}

/// LayerNorm epsilon (PyTorch's default).
const LN_EPS: f64 = 1e-5;

impl EmbeddingHead {
    /// A head from `in_features` pooled channels to `config.dim`.
    pub fn new(in_features: usize, config: &EmbeddingHeadConfig, vb: VarBuilder) -> Result<Self> {
        if config.dim == 0 {
            return Err(Error::invalid("dim", "the embedding dimension must be ≥ 1"));
        }
        if in_features == 0 {
            return Err(Error::invalid("in_features", "must be ≥ 1"));
        }
        Ok(EmbeddingHead {
            config: config.clone(),
            fc: linear(in_features, config.dim, vb.pp("fc"))?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EmbeddingHeadConfig {
        &self.config
    }

    /// `B × C × H × W` features → `B × D` embeddings.
    pub fn forward(&self, features: &Tensor) -> Result<Tensor> {
        let mut x = global_pool(features, self.config.pooling)?;
        if self.config.layer_norm {
            x = layer_norm_no_affine(&x, LN_EPS)?;
        }
        x = apply_linear(&self.fc, &x)?;
        if self.config.normalize {
            x = l2_normalize(&x)?;
        }
        Ok(x)
    }
}

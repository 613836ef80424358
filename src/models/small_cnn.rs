//! A small VGG-style CNN sized for training on 32 × 32 images on a CPU: stages of
//! conv 3×3 – BatchNorm – ReLU blocks, each stage but the last followed by a 2 × 2 max pooling.
//! It returns the last feature map; the [`super::EmbeddingHead`] pools it.

use super::layers::{check_images, max_pool2d, BatchNorm2d, Conv2d};
use crate::error::{Error, Result};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

/// Configuration of [`SmallCnn`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmallCnnConfig {
    /// Input channels (3 for RGB).
    pub in_channels: usize,
    /// Output channels of each stage; the resolution halves between stages.
    pub widths: Vec<usize>,
    /// conv–BN–ReLU blocks per stage.
    pub convs_per_stage: usize,
    /// Keep every BatchNorm in evaluation mode (running statistics, affine parameters trained).
    pub frozen_bn: bool,
}

impl Default for SmallCnnConfig {
    /// Four stages of 32, 64, 128, 256 channels, one block each: 32 × 32 → 4 × 4 × 256.
    fn default() -> Self {
        SmallCnnConfig {
            in_channels: 3,
            widths: vec![32, 64, 128, 256],
            convs_per_stage: 1,
            frozen_bn: false,
        }
    }
}

impl SmallCnnConfig {
    /// Errors naming the first invalid field.
    pub fn validate(&self) -> Result<()> {
        if self.in_channels == 0 {
            return Err(Error::invalid("in_channels", "must be ≥ 1"));
        }
        if self.widths.is_empty() || self.widths.contains(&0) {
            return Err(Error::invalid(
                "widths",
                format!(
                    "need at least one stage and positive widths, got {:?}",
                    self.widths
                ),
            ));
        }
        if self.convs_per_stage == 0 {
            return Err(Error::invalid("convs_per_stage", "must be ≥ 1"));
        }
        Ok(())
    }

    /// Channels of the output feature map.
    pub fn out_channels(&self) -> usize {
        *self.widths.last().unwrap_or(&0)
    }
}

/// One conv 3×3 (no bias) – BatchNorm – ReLU block.
#[derive(Debug, Clone)]
struct Block {
    conv: Conv2d,
    bn: BatchNorm2d,
}

/// The small CNN. Variables are named `stages.{s}.{b}.conv.weight` and `stages.{s}.{b}.bn.*`.
#[derive(Debug, Clone)]
pub struct SmallCnn {
    config: SmallCnnConfig,
    stages: Vec<Vec<Block>>,
}

impl SmallCnn {
    /// Builds the network, creating (or reusing) its variables in `vb`.
    pub fn new(config: &SmallCnnConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let mut stages = Vec::with_capacity(config.widths.len());
        let mut channels = config.in_channels;
        for (s, &width) in config.widths.iter().enumerate() {
            let vs = vb.pp("stages").pp(s);
            let mut blocks = Vec::with_capacity(config.convs_per_stage);
            for b in 0..config.convs_per_stage {
                let vbb = vs.pp(b);
                blocks.push(Block {
                    conv: Conv2d::new(channels, width, 3, 1, 1, false, vbb.pp("conv"))?,
                    bn: BatchNorm2d::new(width, config.frozen_bn, vbb.pp("bn"))?,
                });
                channels = width;
            }
            stages.push(blocks);
        }
        Ok(SmallCnn {
            config: config.clone(),
            stages,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SmallCnnConfig {
        &self.config
    }

    /// Whether some BatchNorm uses batch statistics in training.
    pub fn uses_batch_statistics(&self) -> bool {
        self.stages
            .iter()
            .flatten()
            .any(|b| b.bn.uses_batch_statistics())
    }

    /// `B × C × H × W` images → `B × widths.last() × H/2^(S−1) × W/2^(S−1)` features.
    pub fn forward_t(&self, x: &candle_core::Tensor, train: bool) -> Result<candle_core::Tensor> {
        check_images(x, self.config.in_channels)?;
        let mut h = x.clone();
        for (s, blocks) in self.stages.iter().enumerate() {
            for block in blocks {
                h = block.bn.forward_relu(&block.conv.forward(&h)?, train)?;
            }
            if s + 1 < self.stages.len() {
                h = max_pool2d(&h, 2, 2, 0)?;
            }
        }
        Ok(h)
    }
}

//! Models: backbones ([`SmallCnn`] for 32 × 32 CPU training, torchvision-compatible
//! [`ResNet`]-18/34/50), the papers' [`EmbeddingHead`], and the [`EmbeddingNet`] that chains
//! them, in the candle-transformers style (`Config` + `new(cfg, vb)` + `forward`).
//!
//! Variables live in a [`ParamStore`] (a seeded `VarMap`): the backbone under
//! [`BACKBONE_PREFIX`], the head under [`HEAD_PREFIX`], so optimizers can give them their own
//! parameter groups and pretrained ImageNet weights load into the backbone by torchvision name
//! ([`ParamStore::load_safetensors`]).

pub mod conv;
mod cpu_ops;
#[cfg(feature = "cudnn")]
pub mod cudnn;
pub mod head;
pub mod layers;
pub mod params;
pub mod pretrained;
pub mod resnet;
pub mod small_cnn;

pub use head::{EmbeddingHead, EmbeddingHeadConfig};
pub use layers::Pooling;
pub use params::ParamStore;
pub use resnet::{ResNet, ResNetConfig, ResNetDepth};
pub use small_cnn::{SmallCnn, SmallCnnConfig};

use crate::error::Result;
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

/// Name prefix of the backbone's variables.
pub const BACKBONE_PREFIX: &str = "backbone.";
/// Name prefix of the head's variables.
pub const HEAD_PREFIX: &str = "head.";

/// Which backbone, with its configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BackboneConfig {
    /// The small CNN.
    SmallCnn(SmallCnnConfig),
    /// A torchvision ResNet.
    Resnet(ResNetConfig),
}

impl Default for BackboneConfig {
    fn default() -> Self {
        BackboneConfig::SmallCnn(SmallCnnConfig::default())
    }
}

impl BackboneConfig {
    /// Channels of the feature map the backbone returns.
    pub fn out_channels(&self) -> usize {
        match self {
            BackboneConfig::SmallCnn(c) => c.out_channels(),
            BackboneConfig::Resnet(c) => c.out_channels(),
        }
    }
}

/// A backbone.
#[derive(Debug, Clone)]
pub enum Backbone {
    /// The small CNN.
    SmallCnn(SmallCnn),
    /// A ResNet.
    Resnet(ResNet),
}

impl Backbone {
    /// Builds the configured backbone in `vb`.
    pub fn new(config: &BackboneConfig, vb: VarBuilder) -> Result<Self> {
        Ok(match config {
            BackboneConfig::SmallCnn(c) => Backbone::SmallCnn(SmallCnn::new(c, vb)?),
            BackboneConfig::Resnet(c) => Backbone::Resnet(ResNet::new(c, vb)?),
        })
    }

    /// Images → feature map.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        match self {
            Backbone::SmallCnn(m) => m.forward_t(x, train),
            Backbone::Resnet(m) => m.forward_t(x, train),
        }
    }

    /// Whether some BatchNorm uses batch statistics in training (not frozen).
    pub fn uses_batch_statistics(&self) -> bool {
        match self {
            Backbone::SmallCnn(m) => m.uses_batch_statistics(),
            Backbone::Resnet(m) => m.uses_batch_statistics(),
        }
    }
}

/// Configuration of an [`EmbeddingNet`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingNetConfig {
    /// The backbone.
    pub backbone: BackboneConfig,
    /// The head.
    pub head: EmbeddingHeadConfig,
}

/// Backbone + embedding head: images (`B × 3 × H × W`) → embeddings (`B × D`).
#[derive(Debug, Clone)]
pub struct EmbeddingNet {
    config: EmbeddingNetConfig,
    backbone: Backbone,
    head: EmbeddingHead,
}

impl EmbeddingNet {
    /// Builds the network with the backbone under [`BACKBONE_PREFIX`] and the head under
    /// [`HEAD_PREFIX`] of `vb`.
    pub fn new(config: &EmbeddingNetConfig, vb: VarBuilder) -> Result<Self> {
        let backbone = Backbone::new(
            &config.backbone,
            vb.pp(BACKBONE_PREFIX.trim_end_matches('.')),
        )?;
        let head = EmbeddingHead::new(
            config.backbone.out_channels(),
            &config.head,
            vb.pp(HEAD_PREFIX.trim_end_matches('.')),
        )?;
        Ok(EmbeddingNet {
            config: config.clone(),
            backbone,
            head,
        })
    }

    /// The embedding dimension `D` (the head's output size).
    pub fn dim(&self) -> usize {
        self.config.head.dim
    }

    /// The configuration.
    pub fn config(&self) -> &EmbeddingNetConfig {
        &self.config
    }

    /// Embeddings of a batch of images; `train` selects batch statistics in live BatchNorm.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.head.forward(&self.backbone.forward_t(x, train)?)
    }

    /// Whether the backbone has a BatchNorm that uses batch statistics in training.
    pub fn uses_batch_statistics(&self) -> bool {
        self.backbone.uses_batch_statistics()
    }
}

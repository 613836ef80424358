//! ResNet-18/34/50 (He et al., 2016) with torchvision's architecture and state-dict names, so
//! that ImageNet weights converted to safetensors load by name (`conv1.weight`, `bn1.*`,
//! `layer{1..4}.{i}.conv{1,2,3}.weight`, `layer{1..4}.{i}.bn{1,2,3}.*`,
//! `layer{k}.0.downsample.{0,1}.*`). The classifier (`fc`) is left out: the backbone returns the
//! last feature map (`B × 512 × H/32 × W/32`, 2048 channels for ResNet-50) for the
//! [`super::EmbeddingHead`].
//!
//! ResNet-50 is torchvision's "v1.5" (stride on the 3 × 3 convolution of the bottleneck).
//! BatchNorm can be frozen ([`ResNetConfig::frozen_bn`]): HAPPIER and Smooth-AP train their
//! pretrained backbones with frozen BN.

use super::layers::{check_images, max_pool2d, BatchNorm2d, Conv2d};
use crate::error::Result;
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

/// Depth of a [`ResNet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResNetDepth {
    /// ResNet-18: basic blocks `[2, 2, 2, 2]`, 512 output channels.
    Resnet18,
    /// ResNet-34: basic blocks `[3, 4, 6, 3]`, 512 output channels.
    Resnet34,
    /// ResNet-50: bottleneck blocks `[3, 4, 6, 3]`, 2048 output channels.
    Resnet50,
}

impl ResNetDepth {
    fn blocks(self) -> [usize; 4] {
        match self {
            ResNetDepth::Resnet18 => [2, 2, 2, 2],
            ResNetDepth::Resnet34 | ResNetDepth::Resnet50 => [3, 4, 6, 3],
        }
    }

    fn bottleneck(self) -> bool {
        self == ResNetDepth::Resnet50
    }
}

/// Configuration of [`ResNet`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResNetConfig {
    /// The depth.
    pub depth: ResNetDepth,
    /// Keep every BatchNorm in evaluation mode (running statistics, affine parameters trained),
    /// as HAPPIER's `freeze_batch_norm` and Smooth-AP.
    #[serde(default)]
    pub frozen_bn: bool,
    /// Channels of the stem and of the first stage (64 in every torchvision ResNet; stage `l`
    /// has `base_width · 2^l` planes). Smaller values give miniature ResNets with the same
    /// names, for tests and quick CPU runs; pretrained weights need 64.
    #[serde(default = "default_base_width")]
    pub base_width: usize,
}

fn default_base_width() -> usize {
    64
}

impl ResNetConfig {
    /// A torchvision ResNet of `depth` (base width 64).
    pub fn new(depth: ResNetDepth, frozen_bn: bool) -> Self {
        ResNetConfig {
            depth,
            frozen_bn,
            base_width: 64,
        }
    }

    /// Channels of the output feature map (`8 · base_width`, or `32 · base_width` for
    /// ResNet-50: 512 and 2048 for torchvision's).
    pub fn out_channels(&self) -> usize {
        let planes = self.base_width * 8;
        if self.depth.bottleneck() {
            planes * 4
        } else {
            planes
        }
    }
}

/// A residual block (basic or bottleneck) with its optional projection shortcut.
#[derive(Debug, Clone)]
struct Block {
    convs: Vec<(Conv2d, BatchNorm2d)>,
    downsample: Option<(Conv2d, BatchNorm2d)>,
}

impl Block {
    fn new(
        in_c: usize,
        planes: usize,
        stride: usize,
        bottleneck: bool,
        frozen: bool,
        vb: VarBuilder,
    ) -> Result<Self> {
        let expansion = if bottleneck { 4 } else { 1 };
        let out_c = planes * expansion;
        // (in, out, kernel, stride, padding) of conv1, conv2[, conv3].
        let specs: Vec<(usize, usize, usize, usize, usize)> = if bottleneck {
            vec![
                (in_c, planes, 1, 1, 0),
                (planes, planes, 3, stride, 1),
                (planes, out_c, 1, 1, 0),
            ]
        } else {
            vec![(in_c, planes, 3, stride, 1), (planes, planes, 3, 1, 1)]
        };
        let convs = specs
            .into_iter()
            .enumerate()
            .map(|(i, (ci, co, k, s, p))| {
                Ok((
                    Conv2d::new(ci, co, k, s, p, false, vb.pp(format!("conv{}", i + 1)))?,
                    BatchNorm2d::new(co, frozen, vb.pp(format!("bn{}", i + 1)))?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let downsample = if stride != 1 || in_c != out_c {
            let vd = vb.pp("downsample");
            Some((
                Conv2d::new(in_c, out_c, 1, stride, 0, false, vd.pp(0))?,
                BatchNorm2d::new(out_c, frozen, vd.pp(1))?,
            ))
        } else {
            None
        };
        Ok(Block { convs, downsample })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let shortcut = match &self.downsample {
            Some((conv, bn)) => bn.forward(&conv.forward(x)?, train)?,
            None => x.clone(),
        };
        let mut h = x.clone();
        let last = self.convs.len() - 1;
        for (i, (conv, bn)) in self.convs.iter().enumerate() {
            let y = conv.forward(&h)?;
            h = if i < last {
                bn.forward_relu(&y, train)?
            } else {
                // relu(bn(y) + shortcut), one op on the CPU in training.
                bn.forward_add_relu(&y, &shortcut, train)?
            };
        }
        Ok(h)
    }

    fn batch_norms(&self) -> impl Iterator<Item = &BatchNorm2d> {
        self.convs
            .iter()
            .map(|(_, bn)| bn)
            .chain(self.downsample.iter().map(|(_, bn)| bn))
    }
}

/// A torchvision ResNet without its classifier.
#[derive(Debug, Clone)]
pub struct ResNet {
    config: ResNetConfig,
    conv1: Conv2d,
    bn1: BatchNorm2d,
    layers: Vec<Vec<Block>>,
}

impl ResNet {
    /// Builds the network, creating (or reusing) its variables in `vb` under torchvision's names.
    pub fn new(config: &ResNetConfig, vb: VarBuilder) -> Result<Self> {
        if config.base_width == 0 {
            return Err(crate::Error::invalid("base_width", "must be ≥ 1"));
        }
        let frozen = config.frozen_bn;
        let bottleneck = config.depth.bottleneck();
        let width = config.base_width;
        let conv1 = Conv2d::new(3, width, 7, 2, 3, false, vb.pp("conv1"))?;
        let bn1 = BatchNorm2d::new(width, frozen, vb.pp("bn1"))?;
        let mut in_c = width;
        let mut layers = Vec::with_capacity(4);
        for (l, &n) in config.depth.blocks().iter().enumerate() {
            let planes = width << l;
            let vl = vb.pp(format!("layer{}", l + 1));
            let mut blocks = Vec::with_capacity(n);
            for i in 0..n {
                let stride = if i == 0 && l > 0 { 2 } else { 1 };
                blocks.push(Block::new(
                    in_c,
                    planes,
                    stride,
                    bottleneck,
                    frozen,
                    vl.pp(i),
                )?);
                in_c = planes * if bottleneck { 4 } else { 1 };
            }
            layers.push(blocks);
        }
        Ok(ResNet {
            config: config.clone(),
            conv1,
            bn1,
            layers,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ResNetConfig {
        &self.config
    }

    /// Whether some BatchNorm uses batch statistics in training.
    pub fn uses_batch_statistics(&self) -> bool {
        self.bn1.uses_batch_statistics()
            || self
                .layers
                .iter()
                .flatten()
                .flat_map(Block::batch_norms)
                .any(BatchNorm2d::uses_batch_statistics)
    }

    /// `B × 3 × H × W` images → `B × C × H/32 × W/32` features (sizes rounded as torchvision).
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        check_images(x, 3)?;
        let h = self.bn1.forward_relu(&self.conv1.forward(x)?, train)?;
        let mut h = max_pool2d(&h, 3, 2, 1)?;
        for block in self.layers.iter().flatten() {
            h = block.forward(&h, train)?;
        }
        Ok(h)
    }
}

//! How the images of a dataset on disk become network input: the `[dataset.images]` table
//! ([`ImageSettings`]: transform presets, crop size, decoding threads) and the input
//! normalisation. The datasets themselves, and [`DatasetConfig`](super::loaders::DatasetConfig)
//! that a recipe's `[dataset]` table names one of them with, are in [`super::loaders`].
//!
//! ```toml
//! [dataset]
//! kind = "sop"                         # embedded | sop | inaturalist | dyml | cub | cars | inshop | vehicleid
//! root = "/data/Stanford_Online_Products"
//!
//! [dataset.images]
//! train_transform = "happier_sop_train"
//! test_transform = "happier_sop_test"
//! threads = 8                          # decoding threads (0 = all cores)
//! ```

use super::pipeline::{Normalize, Op, Resize, Transform};
use serde::{Deserialize, Serialize};

/// How images are normalised before the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputNorm {
    /// Per-channel mean and standard deviation of the training images.
    #[default]
    Dataset,
    /// torchvision's ImageNet statistics (for pretrained backbones).
    Imagenet,
    /// None.
    None,
}

/// A preprocessing of the papers' code or text (torchvision semantics, [`Transform`]); every
/// preset ends with a 224 × 224 crop (scaled by [`ImageSettings::crop_size`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransformPreset {
    /// Smooth-AP's code (`datasets.py`): `RandomResizedCrop(224)` (scale (0.08, 1)) + flip.
    RetrievalTrain,
    /// Smooth-AP's code and HAPPIER on iNat / DyML, test: `Resize(256)` + `CenterCrop(224)`.
    RetrievalTest,
    /// HAPPIER on SOP: `Resize(256)` + `RandomResizedCrop(224, (0.16, 1), (0.75, 1.33))` + flip.
    HappierSopTrain,
    /// HAPPIER on SOP, test: `Resize((256, 256))` + `CenterCrop(224)`.
    HappierSopTest,
    /// HAPPIER on iNaturalist and DyML: `RandomResizedCrop(224, (0.16, 1), (0.75, 1.33))` + flip.
    HappierInatTrain,
    /// The text of Smooth-AP (§4.1) and RaMBO (§5.1): images resized to 256 × 256, a random
    /// 224 × 224 crop and a horizontal flip.
    SquareRandomCrop,
    /// The text of Smooth-AP and RaMBO, test: resized to 256 × 256, centre crop 224 × 224 (the
    /// same steps as [`TransformPreset::HappierSopTest`]).
    SquareCenterCrop,
}

impl TransformPreset {
    /// The `(train, test)` pair of the papers' text (Smooth-AP §4.1, RaMBO §5.1): 256 × 256, a
    /// random / centre 224 crop — the default of the datasets without published transforms.
    pub const SQUARE_CROPS: (TransformPreset, TransformPreset) = (
        TransformPreset::SquareRandomCrop,
        TransformPreset::SquareCenterCrop,
    );

    /// The transform with ImageNet normalisation and the papers' sizes.
    pub fn transform(self) -> Transform {
        match self {
            TransformPreset::RetrievalTrain => Transform::retrieval_train(),
            TransformPreset::RetrievalTest => Transform::retrieval_test(),
            TransformPreset::HappierSopTrain => Transform::happier_sop_train(),
            TransformPreset::HappierSopTest | TransformPreset::SquareCenterCrop => {
                Transform::happier_sop_test()
            }
            TransformPreset::HappierInatTrain => Transform::happier_inat_train(),
            TransformPreset::SquareRandomCrop => Transform {
                ops: vec![
                    Op::Resize(Resize::Exact {
                        height: 256,
                        width: 256,
                    }),
                    Op::RandomCrop {
                        height: 224,
                        width: 224,
                        padding: 0,
                    },
                    Op::HorizontalFlip { p: 0.5 },
                ],
                normalize: Normalize::IMAGENET,
            },
        }
    }
}

/// The crop size of every preset.
const PRESET_CROP: u32 = 224;

/// How the images of a real dataset become network input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageSettings {
    /// Training preprocessing; default: the dataset's
    /// ([`DiskDataset::default_transforms`](super::loaders::DiskDataset::default_transforms)).
    pub train_transform: Option<TransformPreset>,
    /// Test preprocessing; default: the dataset's.
    pub test_transform: Option<TransformPreset>,
    /// Final crop side in pixels: every pixel size of the presets is scaled by
    /// `crop_size / 224` (resize 256 → `round(256 · crop_size / 224)`), for quick runs on small
    /// images; `None` keeps the papers' 224.
    pub crop_size: Option<u32>,
    /// Decoding threads; 0 = one per core.
    pub threads: usize,
    /// Batches decoded ahead of the one being trained on.
    pub prefetch: usize,
    /// Check that every listed image file exists before training (seconds for 100k images), so
    /// an incomplete download fails at once rather than mid-epoch.
    pub check_files: bool,
}

impl Default for ImageSettings {
    fn default() -> Self {
        ImageSettings {
            train_transform: None,
            test_transform: None,
            crop_size: None,
            threads: 0,
            prefetch: 2,
            check_files: true,
        }
    }
}

/// `transform` with every pixel size `v` (resizes, crops, padding) replaced by
/// `round(v · crop / 224)`, at least 1 (padding may become 0): the preset for a final crop of
/// `crop` instead of 224.
pub fn scale_sizes(transform: &Transform, crop: u32) -> Transform {
    let s =
        |v: u32| -> u32 { ((v as f64 * crop as f64 / PRESET_CROP as f64).round() as u32).max(1) };
    let ops = transform
        .ops
        .iter()
        .map(|op| match *op {
            Op::Resize(Resize::ShorterSide(v)) => Op::Resize(Resize::ShorterSide(s(v))),
            Op::Resize(Resize::Exact { height, width }) => Op::Resize(Resize::Exact {
                height: s(height),
                width: s(width),
            }),
            Op::CenterCrop { height, width } => Op::CenterCrop {
                height: s(height),
                width: s(width),
            },
            Op::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            } => Op::RandomResizedCrop {
                height: s(height),
                width: s(width),
                scale,
                ratio,
            },
            Op::RandomCrop {
                height,
                width,
                padding,
            } => Op::RandomCrop {
                height: s(height),
                width: s(width),
                padding: (padding as f64 * crop as f64 / PRESET_CROP as f64).round() as u32,
            },
            Op::HorizontalFlip { p } => Op::HorizontalFlip { p },
        })
        .collect();
    Transform {
        ops,
        normalize: transform.normalize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_scale_to_a_smaller_crop() {
        let t = scale_sizes(&TransformPreset::HappierSopTrain.transform(), 56);
        assert_eq!(t.ops[0], Op::Resize(Resize::ShorterSide(64)));
        assert!(matches!(
            t.ops[1],
            Op::RandomResizedCrop {
                height: 56,
                width: 56,
                ..
            }
        ));
        assert_eq!(t.ops[2], Op::HorizontalFlip { p: 0.5 });
        let t = scale_sizes(&TransformPreset::SquareRandomCrop.transform(), 32);
        assert_eq!(
            t.ops[..2],
            [
                Op::Resize(Resize::Exact {
                    height: 37,
                    width: 37
                }),
                Op::RandomCrop {
                    height: 32,
                    width: 32,
                    padding: 0
                }
            ]
        );
        // 224 itself is the identity.
        let t = TransformPreset::RetrievalTest.transform();
        assert_eq!(scale_sizes(&t, 224), t);
    }
}

//! The frozen features of the quick-scale few-shot experiments: the embedded shapes dataset
//! ([`crate::data::shapes`]) split class-disjointly into base / validation / novel classes
//! (64 / 16 / 20 %, CIFAR-FS and mini-ImageNet proportions, [`crate::data::few_shot_split`]),
//! the small CNN trained on the base classes with the crate's [`Trainer`] and any
//! [`RankLoss`], and the novel classes embedded by the trained (or, for the random-init
//! baseline, untrained) network.
//!
//! SSR's backbones are cosine classifiers trained for 120 epochs on the base classes
//! (Sec. 3.2); here a rank loss on the base classes stands in for them at CPU scale.

use crate::data::source::{InMemorySource, Normalization};
use crate::data::{few_shot_split, FewShotFractions, FewShotSplit, ImageSet};
use crate::error::Result;
use crate::hierarchy::{ClassId, Labels};
use crate::losses::RankLoss;
use crate::train::{TrainConfig, TrainReport, Trainer};
use candle_core::Tensor;

/// What [`quick_backbone_features`] builds.
#[derive(Debug, Clone)]
pub struct QuickBackboneConfig {
    /// Data (`train.data`), network, optimiser and epochs of the backbone; the trainer evaluates
    /// retrieval on the validation classes as `train.eval` says.
    pub train: TrainConfig,
    /// Base / validation / novel fractions of the fine classes.
    pub fractions: FewShotFractions,
    /// Seed of the class split.
    pub split_seed: u64,
    /// Train the backbone (`false`: embed with the initial weights, the random-init baseline).
    pub train_backbone: bool,
}

impl Default for QuickBackboneConfig {
    /// The embedded dataset's defaults (256 fine classes × 30 images), 64/16/20 split with seed
    /// 0, the default small CNN and 5 epochs, no progress bars.
    fn default() -> Self {
        QuickBackboneConfig {
            train: TrainConfig {
                progress: false,
                ..TrainConfig::default()
            },
            fractions: FewShotFractions::default(),
            split_seed: 0,
            train_backbone: true,
        }
    }
}

/// Frozen features of the novel classes and what produced them.
#[derive(Debug, Clone)]
pub struct BackboneFeatures {
    /// Embeddings of every novel-class image, `N × D` (CPU or the training device).
    pub features: Tensor,
    /// Their labels (all hierarchy levels, finest first).
    pub labels: Labels,
    /// The base (training) classes.
    pub base_classes: Vec<ClassId>,
    /// The novel (test) classes.
    pub novel_classes: Vec<ClassId>,
    /// The training run, if the backbone was trained.
    pub report: Option<TrainReport>,
}

/// The embedded dataset of `config` split into base, validation and novel classes, with the
/// input normalisation of the base images (every part is normalised like the images the
/// backbone trains on).
struct SplitImages {
    split: FewShotSplit,
    base: ImageSet,
    val: ImageSet,
    novel: ImageSet,
    norm: Normalization,
}

fn split_images(config: &QuickBackboneConfig) -> Result<SplitImages> {
    config.train.validate()?;
    let data = config.train.dataset.embedded().ok_or_else(|| {
        crate::error::Error::invalid(
            "dataset.kind",
            "the few-shot backbone of the embedded data trains on the embedded dataset",
        )
    })?;
    let images = data.shapes().generate()?;
    let split = few_shot_split(images.labels(), config.fractions, config.split_seed)?;
    let part = |items: &[usize]| -> Result<ImageSet> { images.select(items) };
    let (base, val, novel) = (part(&split.base)?, part(&split.val)?, part(&split.novel)?);
    let norm = crate::train::data::input_normalization(config.train.input_norm, &base)?;
    Ok(SplitImages {
        split,
        base,
        val,
        novel,
        norm,
    })
}

/// Generates the dataset of `config.train.data`, splits its fine classes, trains the backbone
/// on the base classes with `loss` (unless `config.train_backbone` is false) and embeds the
/// novel classes. Errors on invalid configurations (including a split with an empty part).
pub fn quick_backbone_features(
    config: &QuickBackboneConfig,
    loss: &dyn RankLoss,
) -> Result<BackboneFeatures> {
    let SplitImages {
        split,
        base,
        val,
        novel,
        norm,
    } = split_images(config)?;
    let novel_source = InMemorySource::new(novel.clone(), norm)?;
    let mut trainer = Trainer::with_data(config.train.clone(), base, val, loss)?;
    let report = if config.train_backbone {
        Some(trainer.fit()?)
    } else {
        None
    };
    Ok(BackboneFeatures {
        features: trainer.embed(&novel_source)?,
        labels: novel.labels().clone(),
        base_classes: split.base_classes,
        novel_classes: split.novel_classes,
        report,
    })
}

/// The frozen features of every part of the few-shot split (see [`all_split_features`]).
#[derive(Debug, Clone)]
pub struct SplitFeatures {
    /// Base (training) classes: embeddings and labels.
    pub base: (Tensor, Labels),
    /// Validation classes (hyperparameter selection).
    pub val: (Tensor, Labels),
    /// Novel (test) classes.
    pub novel: (Tensor, Labels),
    /// The training run, if the backbone was trained.
    pub report: Option<TrainReport>,
}

/// As [`quick_backbone_features`], but embeds the base and validation classes too: what a
/// method meta-trained on frozen features needs (SSR meta-trains on the base classes and
/// selects its hyperparameters on the validation classes).
pub fn all_split_features(
    config: &QuickBackboneConfig,
    loss: &dyn RankLoss,
) -> Result<SplitFeatures> {
    let SplitImages {
        base,
        val,
        novel,
        norm,
        ..
    } = split_images(config)?;
    let sources = [&base, &val, &novel]
        .map(|s| InMemorySource::new(s.clone(), norm.clone()).map(|src| (src, s.labels().clone())));
    let [b, v, n] = sources;
    let (b, v, n) = (b?, v?, n?);
    let mut trainer = Trainer::with_data(config.train.clone(), base, val, loss)?;
    let report = if config.train_backbone {
        Some(trainer.fit()?)
    } else {
        None
    };
    Ok(SplitFeatures {
        base: (trainer.embed(&b.0)?, b.1),
        val: (trainer.embed(&v.0)?, v.1),
        novel: (trainer.embed(&n.0)?, n.1),
        report,
    })
}

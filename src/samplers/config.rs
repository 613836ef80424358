//! The sampler of a recipe (`[sampler]` in TOML, `kind = "m_per_class" | "hierarchical" |
//! "fast_ap"`): a serde description that [`SamplerConfig::build`] turns into a [`BatchSampler`]
//! over a dataset's labels.

use super::{
    BatchSampler, FastApConfig, FastApSampler, HierarchicalConfig, HierarchicalSampler,
    MPerClassConfig, MPerClassMode, MPerClassSampler,
};
use crate::error::Result;
use crate::hierarchy::Labels;
use serde::{Deserialize, Serialize};

/// The batch sampler (see [`crate::samplers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SamplerConfig {
    /// [`MPerClassSampler`].
    MPerClass {
        /// Items per batch.
        batch_size: usize,
        /// Items of each class in a batch.
        samples_per_class: usize,
        /// Label level that defines a class.
        #[serde(default)]
        level: usize,
        /// `Some(n)`: pytorch-metric-learning's sampler with `n` batches per epoch (with
        /// replacement); `None`: the Smooth-AP / HAPPIER epoch without replacement.
        #[serde(default)]
        batches_per_epoch: Option<usize>,
        /// Shuffle the items inside each batch (HAPPIER) rather than keep classes contiguous
        /// (Smooth-AP). Only for the epoch mode.
        #[serde(default = "default_true")]
        shuffle_within_batch: bool,
    },
    /// [`HierarchicalSampler`].
    Hierarchical {
        /// Items per batch.
        batch_size: usize,
        /// Items of each class in a batch.
        samples_per_class: usize,
        /// Batches per combination of super-classes.
        batches_per_super_pair: usize,
        /// Super-classes per batch.
        super_classes_per_batch: usize,
        /// Level of the classes.
        class_level: usize,
        /// Level of the super-classes.
        super_level: usize,
        /// Keep only this many batches per epoch.
        #[serde(default)]
        max_batches: Option<usize>,
    },
    /// [`FastApSampler`].
    FastAp {
        /// Items per batch (even).
        batch_size: usize,
        /// Batches per pair of meta-classes.
        batches_per_meta_pair: usize,
        /// Level of the classes.
        class_level: usize,
        /// Level of the meta-classes.
        meta_level: usize,
        /// Shuffle the items inside each class every epoch.
        #[serde(default)]
        shuffle_within_class: bool,
    },
}

fn default_true() -> bool {
    true
}

impl Default for SamplerConfig {
    /// Batches of 64 with 4 images per fine class, one pass per epoch.
    fn default() -> Self {
        SamplerConfig::MPerClass {
            batch_size: 64,
            samples_per_class: 4,
            level: 0,
            batches_per_epoch: None,
            shuffle_within_batch: true,
        }
    }
}

/// A sampler that can be moved across threads.
pub type DynSampler = Box<dyn BatchSampler + Send + Sync>;

impl SamplerConfig {
    /// Builds the sampler over `labels` with `seed`.
    pub fn build(&self, labels: &Labels, seed: u64) -> Result<DynSampler> {
        Ok(match self.clone() {
            SamplerConfig::MPerClass {
                batch_size,
                samples_per_class,
                level,
                batches_per_epoch,
                shuffle_within_batch,
            } => {
                let mode = match batches_per_epoch {
                    Some(n) => MPerClassMode::WithReplacement {
                        batches_per_epoch: n,
                    },
                    None => MPerClassMode::Epoch {
                        shuffle_within_batch,
                    },
                };
                let config = MPerClassConfig {
                    batch_size,
                    samples_per_class,
                    level,
                    mode,
                };
                Box::new(MPerClassSampler::new(labels, config, seed)?)
            }
            SamplerConfig::Hierarchical {
                batch_size,
                samples_per_class,
                batches_per_super_pair,
                super_classes_per_batch,
                class_level,
                super_level,
                max_batches,
            } => {
                let config = HierarchicalConfig {
                    batch_size,
                    samples_per_class,
                    batches_per_super_pair,
                    super_classes_per_batch,
                    class_level,
                    super_level,
                    max_batches,
                };
                Box::new(HierarchicalSampler::new(labels, config, seed)?)
            }
            SamplerConfig::FastAp {
                batch_size,
                batches_per_meta_pair,
                class_level,
                meta_level,
                shuffle_within_class,
            } => {
                let config = FastApConfig {
                    batch_size,
                    batches_per_meta_pair,
                    class_level,
                    meta_level,
                    shuffle_within_class,
                };
                Box::new(FastApSampler::new(labels, config, seed)?)
            }
        })
    }
}

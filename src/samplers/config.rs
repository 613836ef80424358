//! The sampler of a recipe (`[sampler]` in TOML, `kind = "m_per_class" | "hierarchical" |
//! "fast_ap"`): a serde description that [`SamplerConfig::build`] turns into a [`BatchSampler`]
//! over a dataset's labels. The hierarchical and FastAP samplers are configured by their own
//! types ([`HierarchicalConfig`], [`FastApConfig`]), so each hyperparameter is written once; the
//! m-per-class recipe keeps its two flat fields (`batches_per_epoch`, `shuffle_within_batch`),
//! which [`MPerClassConfig`]'s mode enum does not read as.

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
    /// [`HierarchicalSampler`], configured by its own type (the recipe's fields are its fields).
    Hierarchical(HierarchicalConfig),
    /// [`FastApSampler`], configured by its own type.
    FastAp(FastApConfig),
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
    /// Items per batch.
    pub fn batch_size(&self) -> usize {
        match self {
            SamplerConfig::MPerClass { batch_size, .. } => *batch_size,
            SamplerConfig::Hierarchical(c) => c.batch_size,
            SamplerConfig::FastAp(c) => c.batch_size,
        }
    }

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
            SamplerConfig::Hierarchical(config) => {
                Box::new(HierarchicalSampler::new(labels, config, seed)?)
            }
            SamplerConfig::FastAp(config) => Box::new(FastApSampler::new(labels, config, seed)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize)]
    struct Recipe {
        sampler: SamplerConfig,
    }

    #[test]
    fn the_samplers_own_configs_are_the_recipe() {
        let text = "[sampler]\nkind = \"hierarchical\"\nbatch_size = 256\nsamples_per_class = 4\n\
                    batches_per_super_pair = 5\nsuper_classes_per_batch = 2\nclass_level = 0\n\
                    super_level = 1\n";
        let r: Recipe = toml::from_str(text).unwrap();
        assert_eq!(
            r.sampler,
            SamplerConfig::Hierarchical(HierarchicalConfig::default())
        );
        // Written back, it reads the same (the run cache keys on this text).
        let again: Recipe = toml::from_str(&toml::to_string(&r).unwrap()).unwrap();
        assert_eq!(again.sampler, r.sampler);
        let fast = "[sampler]\nkind = \"fast_ap\"\nbatch_size = 64\nbatches_per_meta_pair = 2\n\
                    class_level = 0\nmeta_level = 2\n";
        let r: Recipe = toml::from_str(fast).unwrap();
        let SamplerConfig::FastAp(c) = r.sampler else {
            panic!("not FastAP: {:?}", r.sampler)
        };
        assert!(!c.shuffle_within_class);
        // A misspelt field is an error that names it.
        let e = toml::from_str::<Recipe>(&format!("{fast}shuffle_within_clas = true\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shuffle_within_clas"), "{e}");
    }
}

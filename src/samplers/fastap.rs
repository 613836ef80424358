//! FastAP's "hard" mini-batch sampler (Cakir et al., CVPR 2019; `matlab/train_hard.m` of
//! `kunhe/FastAP-metric-learning`). The authors call this sampling essential to FastAP's results
//! (PML issue #105, FastAP issue #3); the poster does not describe it.
//!
//! Per epoch:
//! 1. each meta-class (super-class) shuffles the order of its classes and lists its items class
//!    after class, so the items of a class are contiguous;
//! 2. all unordered pairs of distinct meta-classes are listed and shuffled;
//! 3. each pair gives `batches_per_meta_pair` batches; a batch is `batch_size / 2` consecutive
//!    items of the first meta-class's list followed by `batch_size / 2` of the second's, read from
//!    a per-meta-class cursor that starts at 0 each epoch and wraps around.
//!
//! A batch therefore holds two meta-classes and a few whole (or cut) classes with many positives
//! each; its halves are not shuffled. An epoch is `C(S, 2) × batches_per_meta_pair` batches (SOP:
//! 66 × 5 = 330). A meta-class with fewer than `batch_size / 2` items wraps around within one
//! half, repeating items.

use super::{check_level, combinations, group_by_class, stream_rng, BatchSampler};
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use rand::seq::SliceRandom;
use std::collections::BTreeMap;

/// Configuration of the [`FastApSampler`], and its recipe (`[sampler] kind = "fast_ap"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FastApConfig {
    /// Items per batch (even).
    pub batch_size: usize,
    /// Batches per pair of meta-classes (`batchesPerMetaPair`: 5 for SOP, 2 for In-Shop).
    pub batches_per_meta_pair: usize,
    /// Label level of the classes (0 = finest).
    pub class_level: usize,
    /// Label level of the meta-classes; coarser than `class_level`.
    pub meta_level: usize,
    /// Shuffle the items inside each class every epoch. The authors keep the dataset order
    /// (`metaC{i}.groups` are fixed lists), which is the default `false`.
    #[serde(default)]
    pub shuffle_within_class: bool,
}

impl Default for FastApConfig {
    /// The authors' SOP setting (`get_opts.m`, `train_hard.m`): batches of 256, 5 per meta pair.
    fn default() -> Self {
        FastApConfig {
            batch_size: 256,
            batches_per_meta_pair: 5,
            class_level: 0,
            meta_level: 1,
            shuffle_within_class: false,
        }
    }
}

/// FastAP's meta-class-pair sampler (see the module documentation).
#[derive(Debug, Clone)]
pub struct FastApSampler {
    config: FastApConfig,
    seed: u64,
    /// For each meta-class (increasing id), its classes' items (classes in increasing id order).
    metas: Vec<(ClassId, Vec<Vec<usize>>)>,
}

impl FastApSampler {
    /// Builds the sampler over `labels`.
    ///
    /// Errors when a level does not exist or `meta_level ≤ class_level`, when `batch_size` is not
    /// a positive even number or `batches_per_meta_pair` is 0, and when there are fewer than two
    /// meta-classes.
    pub fn new(labels: &Labels, config: FastApConfig, seed: u64) -> Result<Self> {
        check_level(labels, config.class_level, "class_level")?;
        check_level(labels, config.meta_level, "meta_level")?;
        if config.meta_level <= config.class_level {
            return Err(Error::invalid(
                "meta_level",
                format!(
                    "must be coarser than class_level = {} (0 = finest), got {}",
                    config.class_level, config.meta_level
                ),
            ));
        }
        if config.batch_size == 0 || !config.batch_size.is_multiple_of(2) {
            return Err(Error::invalid(
                "batch_size",
                format!(
                    "must be positive and even (half a batch per meta-class), got {}",
                    config.batch_size
                ),
            ));
        }
        if config.batches_per_meta_pair == 0 {
            return Err(Error::invalid("batches_per_meta_pair", "must be ≥ 1"));
        }
        let meta_of = labels.column(config.meta_level);
        let mut by_meta: BTreeMap<ClassId, Vec<Vec<usize>>> = BTreeMap::new();
        for class in group_by_class(labels, config.class_level) {
            by_meta
                .entry(meta_of[class.items[0]])
                .or_default()
                .push(class.items);
        }
        if by_meta.len() < 2 {
            return Err(Error::invalid(
                "meta_level",
                format!(
                    "batches pair two meta-classes but level {} has only {}",
                    config.meta_level,
                    by_meta.len()
                ),
            ));
        }
        Ok(FastApSampler {
            config,
            seed,
            metas: by_meta.into_iter().collect(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FastApConfig {
        &self.config
    }

    /// Number of batches per epoch: `C(S, 2) × batches_per_meta_pair`.
    pub fn num_batches(&self) -> usize {
        let s = self.metas.len();
        s * (s - 1) / 2 * self.config.batches_per_meta_pair
    }
}

impl BatchSampler for FastApSampler {
    fn seed(&self) -> u64 {
        self.seed
    }

    fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut rng = stream_rng(self.seed, epoch);
        // Step 1: each meta-class's items, class after class, in a fresh class order.
        let lists: Vec<Vec<usize>> = self
            .metas
            .iter()
            .map(|(_, classes)| {
                let mut order: Vec<&Vec<usize>> = classes.iter().collect();
                order.shuffle(&mut rng);
                order
                    .into_iter()
                    .flat_map(|items| {
                        let mut items = items.clone();
                        if self.config.shuffle_within_class {
                            items.shuffle(&mut rng);
                        }
                        items
                    })
                    .collect()
            })
            .collect();
        // Step 2: the pairs m1 < m2 in random order.
        let mut pairs = combinations(lists.len(), 2);
        pairs.shuffle(&mut rng);
        // Step 3: consecutive halves from per-meta-class cursors, wrapping around.
        let half = self.config.batch_size / 2;
        let mut cursor = vec![0usize; lists.len()];
        let mut batches = Vec::with_capacity(self.num_batches());
        for pair in pairs {
            for _ in 0..self.config.batches_per_meta_pair {
                let mut batch = Vec::with_capacity(self.config.batch_size);
                for &m in &pair {
                    let list = &lists[m];
                    batch.extend((0..half).map(|k| list[(cursor[m] + k) % list.len()]));
                    cursor[m] = (cursor[m] + half) % list.len();
                }
                batches.push(batch);
            }
        }
        batches
    }
}

//! The hierarchical super-class batch sampler of HAPPIER and ROADMAP on SOP:
//! pytorch-metric-learning's `HierarchicalSampler` (inspired by
//! `kunhe/Deep-Metric-Learning-Baselines`), wrapped by HAPPIER with
//! `restrict_number_of_batches`.
//!
//! For every combination of `super_classes_per_batch` super-classes, `batches_per_super_pair`
//! batches are built. A batch is split into `super_classes_per_batch` equal parts; each part
//! shuffles the classes of its super-class and takes `samples_per_class` items of each until the
//! part is full, drawing a class's items with replacement only when the class is smaller
//! (`safe_random_choice`). Each batch is shuffled, then the list of batches. An epoch is
//! `C(S, super_classes_per_batch) × batches_per_super_pair` batches (SOP: C(12, 2) × 5 = 330),
//! or the first `max_batches` of them.

use super::{
    check_level, combinations, group_by_class, safe_random_choice, stream_rng, BatchSampler,
    ClassItems,
};
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use rand::seq::SliceRandom;
use std::collections::BTreeMap;

/// Configuration of the [`HierarchicalSampler`], and its recipe (`[sampler] kind =
/// "hierarchical"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HierarchicalConfig {
    /// Items per batch; a multiple of `super_classes_per_batch × samples_per_class`.
    pub batch_size: usize,
    /// Items of each class in a batch.
    pub samples_per_class: usize,
    /// Batches built for each combination of super-classes (PML `batches_per_super_pair`,
    /// HAPPIER `batches_per_super_tuple`).
    pub batches_per_super_pair: usize,
    /// Super-classes in a batch (PML `nb_categories`, HAPPIER `super_classes_per_batch`).
    pub super_classes_per_batch: usize,
    /// Label level of the classes (PML `inner_label`; 0 = finest).
    pub class_level: usize,
    /// Label level of the super-classes (PML `outer_label`); coarser than `class_level`.
    pub super_level: usize,
    /// Keep only the first `max_batches` of the shuffled epoch (HAPPIER
    /// `restrict_number_of_batches`); `None` keeps all.
    #[serde(default)]
    pub max_batches: Option<usize>,
}

impl Default for HierarchicalConfig {
    /// HAPPIER's SOP configuration: batches of 256, 4 images per class, 5 batches per pair of
    /// super-classes, 2 super-classes per batch; fine classes paired by level 1.
    fn default() -> Self {
        HierarchicalConfig {
            batch_size: 256,
            samples_per_class: 4,
            batches_per_super_pair: 5,
            super_classes_per_batch: 2,
            class_level: 0,
            super_level: 1,
            max_batches: None,
        }
    }
}

/// The hierarchical super-class batch sampler (see the module documentation).
///
/// A part is shorter than `batch_size / super_classes_per_batch` when its super-class has fewer
/// than `batch_size / (super_classes_per_batch × samples_per_class)` classes, exactly as in the
/// reference; [`HierarchicalSampler::min_batch_size`] tells the smallest batch this gives.
#[derive(Debug, Clone)]
pub struct HierarchicalSampler {
    config: HierarchicalConfig,
    seed: u64,
    /// The classes of each super-class, super-classes in increasing id order.
    supers: Vec<(ClassId, Vec<ClassItems>)>,
}

impl HierarchicalSampler {
    /// Builds the sampler over `labels`.
    ///
    /// Errors when a level does not exist or `super_level ≤ class_level`, when a size is zero or
    /// `batch_size` is not a multiple of `super_classes_per_batch × samples_per_class`, and when
    /// there are fewer super-classes than `super_classes_per_batch` (at least 2 are needed for a
    /// pair).
    pub fn new(labels: &Labels, config: HierarchicalConfig, seed: u64) -> Result<Self> {
        check_level(labels, config.class_level, "class_level")?;
        check_level(labels, config.super_level, "super_level")?;
        if config.super_level <= config.class_level {
            return Err(Error::invalid(
                "super_level",
                format!(
                    "must be coarser than class_level = {} (levels count from 0 = finest), got {}",
                    config.class_level, config.super_level
                ),
            ));
        }
        for (field, value) in [
            ("samples_per_class", config.samples_per_class),
            ("batches_per_super_pair", config.batches_per_super_pair),
            ("super_classes_per_batch", config.super_classes_per_batch),
        ] {
            if value == 0 {
                return Err(Error::invalid(field, "must be ≥ 1"));
            }
        }
        let unit = config.super_classes_per_batch * config.samples_per_class;
        if config.batch_size == 0 || !config.batch_size.is_multiple_of(unit) {
            return Err(Error::invalid(
                "batch_size",
                format!(
                    "must be a positive multiple of super_classes_per_batch × samples_per_class \
                     = {unit}, got {}",
                    config.batch_size
                ),
            ));
        }
        if config.max_batches == Some(0) {
            return Err(Error::invalid("max_batches", "must be ≥ 1 when given"));
        }
        let supers = group_supers(labels, config.class_level, config.super_level);
        let needed = config.super_classes_per_batch.max(2);
        if supers.len() < needed {
            return Err(Error::invalid(
                "super_level",
                format!(
                    "the sampler pairs {} super-classes per batch but level {} has only {}",
                    needed,
                    config.super_level,
                    supers.len()
                ),
            ));
        }
        Ok(HierarchicalSampler {
            config,
            seed,
            supers,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HierarchicalConfig {
        &self.config
    }

    /// Number of batches per epoch: `C(S, k) × batches_per_super_pair`, capped by `max_batches`.
    pub fn num_batches(&self) -> usize {
        let full = combinations(self.supers.len(), self.config.super_classes_per_batch).len()
            * self.config.batches_per_super_pair;
        self.config.max_batches.map_or(full, |m| m.min(full))
    }

    /// Items in one part of a batch drawn from super-class `s`.
    fn part_len(&self, s: usize) -> usize {
        let spc = self.config.samples_per_class;
        let classes_per_part = self.config.batch_size / self.config.super_classes_per_batch / spc;
        classes_per_part.min(self.supers[s].1.len()) * spc
    }

    /// The smallest batch of an epoch: equal to `batch_size` unless some super-class has too few
    /// classes to fill its part.
    pub fn min_batch_size(&self) -> usize {
        combinations(self.supers.len(), self.config.super_classes_per_batch)
            .iter()
            .map(|combo| combo.iter().map(|&s| self.part_len(s)).sum())
            .min()
            .unwrap_or(0)
    }
}

/// Classes grouped by super-class, both in increasing id order.
fn group_supers(
    labels: &Labels,
    class_level: usize,
    super_level: usize,
) -> Vec<(ClassId, Vec<ClassItems>)> {
    let supers = labels.column(super_level);
    let mut by_super: BTreeMap<ClassId, Vec<ClassItems>> = BTreeMap::new();
    for class in group_by_class(labels, class_level) {
        // Labels guarantee one parent per class, so the first item names the super-class.
        by_super
            .entry(supers[class.items[0]])
            .or_default()
            .push(class);
    }
    by_super.into_iter().collect()
}

impl BatchSampler for HierarchicalSampler {
    fn seed(&self) -> u64 {
        self.seed
    }

    fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut rng = stream_rng(self.seed, epoch);
        let spc = self.config.samples_per_class;
        let mut batches = Vec::new();
        for combo in combinations(self.supers.len(), self.config.super_classes_per_batch) {
            for _ in 0..self.config.batches_per_super_pair {
                let mut batch = Vec::with_capacity(self.config.batch_size);
                for &s in &combo {
                    let classes = &self.supers[s].1;
                    let mut order: Vec<usize> = (0..classes.len()).collect();
                    order.shuffle(&mut rng);
                    for &c in order.iter().take(self.part_len(s) / spc) {
                        batch.extend(safe_random_choice(&classes[c].items, spc, &mut rng));
                    }
                }
                batch.shuffle(&mut rng);
                batches.push(batch);
            }
        }
        batches.shuffle(&mut rng);
        if let Some(m) = self.config.max_batches {
            batches.truncate(m);
        }
        batches
    }
}

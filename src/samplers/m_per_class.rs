//! The m-per-class batch sampler: every batch holds `batch_size / m` distinct classes with `m`
//! items each.
//!
//! Two behaviours of the authors' code, chosen by [`MPerClassMode`]:
//! * [`MPerClassMode::Epoch`] — Smooth-AP's `TrainDatasetsmoothap.reshuffle` (`src/datasets.py`),
//!   ported as `MPerClassSampler` to the HAPPIER, ROADMAP and SupRank repositories. One epoch is
//!   one pass over the data without replacement; leftovers are dropped.
//! * [`MPerClassMode::WithReplacement`] — pytorch-metric-learning's `MPerClassSampler` (HAPPIER's
//!   `PMLMPerClassSampler`): a fixed number of batches, each from a fresh random set of classes,
//!   items drawn with replacement only when a class is too small (`safe_random_choice`).

use super::{
    check_level, group_by_class, safe_random_choice, stream_rng, BatchSampler, ClassItems,
};
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use rand::seq::SliceRandom;

/// How the batches of one epoch are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MPerClassMode {
    /// Smooth-AP / HAPPIER (`MPerClassSampler.reshuffle`): shuffle each class's items and the
    /// class order, then repeatedly walk the classes in that order, taking the next `m` unused
    /// items of each class that still has `m`, until the batch holds `batch_size / m` classes; stop
    /// when a walk cannot fill a batch. Leftovers are dropped and the batch list is shuffled.
    /// The number of batches per epoch depends on the draw (classes early in the order are used
    /// up first); every item is used at most once per epoch.
    Epoch {
        /// Shuffle the items inside each batch (HAPPIER/ROADMAP) instead of keeping each class's
        /// `m` items contiguous, class after class (the original Smooth-AP code, whose loss
        /// reshapes the batch into per-class groups and needs the contiguous order).
        shuffle_within_batch: bool,
    },
    /// pytorch-metric-learning `MPerClassSampler(labels, m, batch_size, length_before_new_iter)`:
    /// `batches_per_epoch` batches; each shuffles the class list, takes the first
    /// `batch_size / m` classes and draws `m` items of each with `safe_random_choice` (with
    /// replacement only for a class smaller than `m`). Items of a batch are class-contiguous.
    WithReplacement {
        /// Number of batches per epoch (`length_before_new_iter / batch_size`).
        batches_per_epoch: usize,
    },
}

impl Default for MPerClassMode {
    /// HAPPIER's sampler: one pass without replacement, batches shuffled inside.
    fn default() -> Self {
        MPerClassMode::Epoch {
            shuffle_within_batch: true,
        }
    }
}

/// Configuration of the m-per-class sampler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MPerClassConfig {
    /// Items per batch; a multiple of `samples_per_class`.
    pub batch_size: usize,
    /// `m`: items of each class in a batch.
    pub samples_per_class: usize,
    /// The label level that defines a class (HAPPIER `hierarchy_level`; 0 = finest).
    pub level: usize,
    /// Epoch definition.
    pub mode: MPerClassMode,
}

impl Default for MPerClassConfig {
    /// HAPPIER's iNat/DyML setting: batches of 256 with 4 images per class, fine level.
    fn default() -> Self {
        MPerClassConfig {
            batch_size: 256,
            samples_per_class: 4,
            level: 0,
            mode: MPerClassMode::default(),
        }
    }
}

/// The m-per-class sampler (see the module documentation).
#[derive(Debug, Clone)]
pub struct MPerClassSampler {
    config: MPerClassConfig,
    seed: u64,
    classes: Vec<ClassItems>,
}

impl MPerClassSampler {
    /// Builds the sampler over `labels`, checking that the configuration can produce a batch.
    ///
    /// Errors when the level does not exist, `batch_size` is not a positive multiple of `m`, or
    /// there are fewer than `batch_size / m` classes (with at least `m` items, in
    /// [`MPerClassMode::Epoch`], which never repeats an item).
    pub fn new(labels: &Labels, config: MPerClassConfig, seed: u64) -> Result<Self> {
        check_level(labels, config.level, "level")?;
        let m = config.samples_per_class;
        if m == 0 {
            return Err(Error::invalid("samples_per_class", "must be ≥ 1"));
        }
        if config.batch_size == 0 || !config.batch_size.is_multiple_of(m) {
            return Err(Error::invalid(
                "batch_size",
                format!(
                    "must be a positive multiple of samples_per_class = {m}, got {}",
                    config.batch_size
                ),
            ));
        }
        let classes = group_by_class(labels, config.level);
        let per_batch = config.batch_size / m;
        match config.mode {
            MPerClassMode::Epoch { .. } => {
                let eligible = classes.iter().filter(|c| c.items.len() >= m).count();
                if eligible < per_batch {
                    let largest = classes.iter().map(|c| c.items.len()).max().unwrap_or(0);
                    return Err(Error::invalid(
                        "samples_per_class",
                        format!(
                            "a batch needs {per_batch} classes with at least m = {m} items, but \
                             only {eligible} of the {} classes at level {} have that many \
                             (largest class: {largest} items); lower m or batch_size",
                            classes.len(),
                            config.level
                        ),
                    ));
                }
            }
            MPerClassMode::WithReplacement { batches_per_epoch } => {
                if batches_per_epoch == 0 {
                    return Err(Error::invalid("batches_per_epoch", "must be ≥ 1"));
                }
                if classes.len() < per_batch {
                    return Err(Error::invalid(
                        "batch_size",
                        format!(
                            "a batch needs {per_batch} distinct classes but level {} has only {}",
                            config.level,
                            classes.len()
                        ),
                    ));
                }
            }
        }
        Ok(MPerClassSampler {
            config,
            seed,
            classes,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MPerClassConfig {
        &self.config
    }

    fn epoch_without_replacement(&self, epoch: u64, shuffle_within: bool) -> Vec<Vec<usize>> {
        let mut rng = stream_rng(self.seed, epoch);
        let m = self.config.samples_per_class;
        let per_batch = self.config.batch_size / m;
        let mut pools: Vec<Vec<usize>> = self.classes.iter().map(|c| c.items.clone()).collect();
        for pool in &mut pools {
            pool.shuffle(&mut rng);
        }
        let mut order: Vec<usize> = (0..pools.len()).collect();
        order.shuffle(&mut rng);
        // `used[c]` = items of class c already taken (the pools are consumed from the front).
        let mut used = vec![0usize; pools.len()];
        let mut batches = Vec::new();
        loop {
            let mut batch = Vec::with_capacity(self.config.batch_size);
            let mut taken = 0;
            for &c in &order {
                if taken == per_batch {
                    break;
                }
                if pools[c].len() - used[c] >= m {
                    batch.extend_from_slice(&pools[c][used[c]..used[c] + m]);
                    used[c] += m;
                    taken += 1;
                }
            }
            if taken < per_batch {
                // The reference stops at the first walk that cannot fill a batch; the classes it
                // touched keep their items, which are dropped with the other leftovers.
                break;
            }
            if shuffle_within {
                batch.shuffle(&mut rng);
            }
            batches.push(batch);
        }
        batches.shuffle(&mut rng);
        batches
    }

    fn epoch_with_replacement(&self, epoch: u64, batches_per_epoch: usize) -> Vec<Vec<usize>> {
        let mut rng = stream_rng(self.seed, epoch);
        let m = self.config.samples_per_class;
        let per_batch = self.config.batch_size / m;
        let mut order: Vec<usize> = (0..self.classes.len()).collect();
        (0..batches_per_epoch)
            .map(|_| {
                order.shuffle(&mut rng);
                order[..per_batch]
                    .iter()
                    .flat_map(|&c| safe_random_choice(&self.classes[c].items, m, &mut rng))
                    .collect()
            })
            .collect()
    }
}

impl BatchSampler for MPerClassSampler {
    fn seed(&self) -> u64 {
        self.seed
    }

    fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        match self.config.mode {
            MPerClassMode::Epoch {
                shuffle_within_batch,
            } => self.epoch_without_replacement(epoch, shuffle_within_batch),
            MPerClassMode::WithReplacement { batches_per_epoch } => {
                self.epoch_with_replacement(epoch, batches_per_epoch)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_fills_batches_from_the_front_of_the_class_order() {
        // One class of 4 and two of 2, m = 2, two classes per batch: the walk always takes the
        // first two eligible classes in the shuffled order, so the epoch has 2 batches when the
        // large class comes first or second ({0, x}, {0, y}) and 1 when it comes last ({1, 2}),
        // as in the reference.
        let y = Labels::from_fine(&[0, 0, 0, 0, 1, 1, 2, 2]).unwrap();
        let config = MPerClassConfig {
            batch_size: 4,
            samples_per_class: 2,
            level: 0,
            mode: MPerClassMode::Epoch {
                shuffle_within_batch: false,
            },
        };
        let s = MPerClassSampler::new(&y, config, 0).unwrap();
        let mut lengths = std::collections::BTreeSet::new();
        for epoch in 0..50 {
            let batches = s.batches(epoch);
            lengths.insert(batches.len());
            for b in &batches {
                // Contiguous: items 0-1 share a class, items 2-3 share another.
                assert_eq!(y.fine(b[0]), y.fine(b[1]));
                assert_eq!(y.fine(b[2]), y.fine(b[3]));
                assert_ne!(y.fine(b[0]), y.fine(b[2]));
            }
        }
        assert_eq!(lengths, [1, 2].into_iter().collect());
    }
}

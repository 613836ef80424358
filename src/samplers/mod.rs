//! Mini-batch and episode samplers of the five papers' training code.
//!
//! | sampler | used by | module |
//! |---|---|---|
//! | [`MPerClassSampler`] | Smooth-AP, HAPPIER (iNat, DyML), ROADMAP | [`m_per_class`] |
//! | [`HierarchicalSampler`] | HAPPIER / ROADMAP on SOP (PML `HierarchicalSampler`) | [`hierarchical`] |
//! | [`FastApSampler`] | FastAP (`matlab/train_hard.m`) | [`fastap`] |
//! | [`EpisodeSampler`] | SSR few-shot (N-way K-shot episodes) | [`episodes`] |
//!
//! **Reproducibility and resuming.** Every batch sampler is a pure function of
//! `(labels, config, seed, epoch)`: [`BatchSampler::batches`] regenerates the batches of any
//! epoch from scratch, with no hidden state. Epoch `e` draws from its own ChaCha8 stream
//! (`ChaCha8Rng::seed_from_u64(seed)` on stream `e`), so epochs are independent and training
//! resumes exactly by storing a [`SamplerState`] (seed + epoch index) in the checkpoint.
//! The *distributions* are those of the authors' samplers; the random draws themselves cannot
//! match numpy's or MATLAB's generators.

pub mod config;
pub mod episodes;
pub mod fastap;
pub mod hierarchical;
pub mod m_per_class;

pub use config::{DynSampler, SamplerConfig};
pub use episodes::{Episode, EpisodeConfig, EpisodeSampler};
pub use fastap::{FastApConfig, FastApSampler};
pub use hierarchical::{HierarchicalConfig, HierarchicalSampler};
pub use m_per_class::{MPerClassConfig, MPerClassMode, MPerClassSampler};

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use rand::seq::index;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A sampler of training mini-batches (lists of item indices into the labels it was built on).
pub trait BatchSampler {
    /// The seed all epochs derive from.
    fn seed(&self) -> u64;

    /// The batches of epoch `epoch` (0-based), in training order: a pure function of the labels,
    /// the configuration, [`BatchSampler::seed`] and `epoch`.
    fn batches(&self, epoch: u64) -> Vec<Vec<usize>>;
}

/// What a checkpoint stores to resume sampling: the batches of `epoch` are
/// `sampler.batches(epoch)` for a sampler rebuilt with the same labels, configuration and `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Seed of the sampler.
    pub seed: u64,
    /// Index of the next epoch to run (0-based).
    pub epoch: u64,
}

impl SamplerState {
    /// The batches of the state's epoch.
    pub fn batches(&self, sampler: &dyn BatchSampler) -> Result<Vec<Vec<usize>>> {
        if sampler.seed() != self.seed {
            return Err(Error::invalid(
                "seed",
                format!(
                    "the checkpoint was sampled with seed {} but the sampler has seed {}",
                    self.seed,
                    sampler.seed()
                ),
            ));
        }
        Ok(sampler.batches(self.epoch))
    }

    /// The state of the following epoch.
    pub fn next(self) -> Self {
        SamplerState {
            epoch: self.epoch + 1,
            ..self
        }
    }
}

/// The random generator of one epoch (or one episode): stream `stream` of the ChaCha8 generator
/// seeded with `seed`. Streams are independent, so any epoch can be regenerated alone.
pub fn stream_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// The items of one class, in dataset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassItems {
    pub class: ClassId,
    pub items: Vec<usize>,
}

/// Items grouped by their class at `level`, classes in increasing id order (a deterministic order
/// is needed: the random draws then depend only on the seed).
pub(crate) fn group_by_class(labels: &Labels, level: usize) -> Vec<ClassItems> {
    let mut groups: BTreeMap<ClassId, Vec<usize>> = BTreeMap::new();
    for (i, c) in labels.column(level).into_iter().enumerate() {
        groups.entry(c).or_default().push(i);
    }
    groups
        .into_iter()
        .map(|(class, items)| ClassItems { class, items })
        .collect()
}

/// Errors unless `level` is a column of `labels`; `field` names the configuration field.
pub(crate) fn check_level(labels: &Labels, level: usize, field: &str) -> Result<()> {
    if level >= labels.num_levels() {
        return Err(Error::invalid(
            field,
            format!(
                "level {level} does not exist (labels have {} levels, 0 = finest)",
                labels.num_levels()
            ),
        ));
    }
    Ok(())
}

/// PML's `safe_random_choice`: `size` items of `items`, without replacement when the list is
/// long enough, with replacement otherwise.
pub(crate) fn safe_random_choice<R: Rng>(items: &[usize], size: usize, rng: &mut R) -> Vec<usize> {
    if items.len() >= size {
        index::sample(rng, items.len(), size)
            .into_iter()
            .map(|k| items[k])
            .collect()
    } else {
        (0..size)
            .map(|_| items[rng.random_range(0..items.len())])
            .collect()
    }
}

/// All `k`-element combinations of `0..n` in lexicographic order (Python's
/// `itertools.combinations(range(n), k)`).
pub(crate) fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    if k > n {
        return out;
    }
    let mut current: Vec<usize> = (0..k).collect();
    loop {
        out.push(current.clone());
        // Advance the rightmost position that can still move right.
        let Some(i) = (0..k).rev().find(|&i| current[i] < n - k + i) else {
            return out;
        };
        current[i] += 1;
        for j in i + 1..k {
            current[j] = current[j - 1] + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_match_itertools() {
        assert_eq!(
            combinations(4, 2),
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        assert_eq!(combinations(12, 2).len(), 66);
        assert_eq!(combinations(5, 3).len(), 10);
        assert_eq!(combinations(3, 0), vec![Vec::<usize>::new()]);
        assert!(combinations(2, 3).is_empty());
    }

    #[test]
    fn safe_random_choice_replaces_only_when_short() {
        let mut rng = stream_rng(1, 0);
        let items = [10, 11, 12, 13, 14];
        let mut a = safe_random_choice(&items, 5, &mut rng);
        a.sort_unstable();
        assert_eq!(a, items);
        let b = safe_random_choice(&items[..2], 6, &mut rng);
        assert_eq!(b.len(), 6);
        assert!(b.iter().all(|x| *x == 10 || *x == 11));
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let x: u64 = stream_rng(7, 3).random();
        assert_eq!(x, stream_rng(7, 3).random::<u64>());
        assert_ne!(x, stream_rng(7, 4).random::<u64>());
        assert_ne!(x, stream_rng(8, 3).random::<u64>());
    }

    #[test]
    fn groups_are_sorted_by_class() {
        let y = Labels::from_fine(&[5, 2, 5, 9, 2]).unwrap();
        let g = group_by_class(&y, 0);
        assert_eq!(g.len(), 3);
        assert_eq!((g[0].class, g[0].items.clone()), (2, vec![1, 4]));
        assert_eq!((g[1].class, g[1].items.clone()), (5, vec![0, 2]));
        assert!(check_level(&y, 1, "level").is_err());
    }
}

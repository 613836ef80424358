//! Few-shot episodes (N-way, K-shot, Q queries per class), as sampled by SSR's few-shot code
//! (`transductive_few_shot/src/dataloader.py` `EpisodeSampler.getEpisode` and
//! `generate_val_episode.py`, both from SIB): draw N distinct classes, then K + Q distinct items
//! of each; the first K are the support, the other Q the queries. Episode labels are the
//! classes' positions `0..N` in the draw. The queries are randomly permuted ("not necessary in
//! our approach", but done by the code); the support stays class by class.
//!
//! Episode `i` of a sampler is a pure function of `(labels, config, seed, i)`: a fixed validation
//! set (SSR: 1,000 episodes saved to JSON) is simply episodes `0..1000` of a fixed seed, and test
//! episodes (SSR: 2,000) another seed.

use super::{check_level, group_by_class, stream_rng, ClassItems};
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use rand::seq::{index, SliceRandom};
use serde::{Deserialize, Serialize};

/// Configuration of the [`EpisodeSampler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeConfig {
    /// N: classes per episode.
    pub ways: usize,
    /// K: support items per class.
    pub shots: usize,
    /// Q: query items per class.
    pub queries: usize,
    /// The label level that defines a class (0 = finest).
    pub level: usize,
    /// Randomly permute the queries (SSR/SIB code); `false` keeps them class by class.
    pub shuffle_queries: bool,
}

impl Default for EpisodeConfig {
    /// SSR's few-shot protocol: 5-way 1-shot, 15 queries per class, queries permuted.
    fn default() -> Self {
        EpisodeConfig {
            ways: 5,
            shots: 1,
            queries: 15,
            level: 0,
            shuffle_queries: true,
        }
    }
}

/// One episode: item indices into the sampler's labels, and episode labels `0..N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Episode {
    /// The original class ids; `classes[e]` is the class with episode label `e`.
    pub classes: Vec<ClassId>,
    /// Support items, `shots` per class, class after class (`N × K`).
    pub support: Vec<usize>,
    /// Episode label of each support item.
    pub support_labels: Vec<usize>,
    /// Query items (`N × Q`).
    pub query: Vec<usize>,
    /// Episode label of each query item.
    pub query_labels: Vec<usize>,
}

/// The few-shot episode sampler (see the module documentation).
#[derive(Debug, Clone)]
pub struct EpisodeSampler {
    config: EpisodeConfig,
    seed: u64,
    classes: Vec<ClassItems>,
}

impl EpisodeSampler {
    /// Builds the sampler over `labels` (typically the items of one few-shot split).
    ///
    /// Errors when the level does not exist, a size is zero, there are fewer than N classes, or a
    /// class has fewer than K + Q items (the reference would fail drawing without replacement).
    pub fn new(labels: &Labels, config: EpisodeConfig, seed: u64) -> Result<Self> {
        check_level(labels, config.level, "level")?;
        for (field, value) in [
            ("ways", config.ways),
            ("shots", config.shots),
            ("queries", config.queries),
        ] {
            if value == 0 {
                return Err(Error::invalid(field, "must be ≥ 1"));
            }
        }
        let classes = group_by_class(labels, config.level);
        if config.ways > classes.len() {
            return Err(Error::invalid(
                "ways",
                format!(
                    "{}-way episodes need {} classes but level {} has only {}",
                    config.ways,
                    config.ways,
                    config.level,
                    classes.len()
                ),
            ));
        }
        let per_class = config.shots + config.queries;
        if let Some(small) = classes.iter().find(|c| c.items.len() < per_class) {
            return Err(Error::invalid(
                "queries",
                format!(
                    "each class must have shots + queries = {per_class} items, but class {} has \
                     {}",
                    small.class,
                    small.items.len()
                ),
            ));
        }
        Ok(EpisodeSampler {
            config,
            seed,
            classes,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EpisodeConfig {
        &self.config
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Episode number `index` (its own random stream).
    pub fn episode(&self, index: u64) -> Episode {
        let mut rng = stream_rng(self.seed, index);
        let (n, k, q) = (self.config.ways, self.config.shots, self.config.queries);
        let chosen = index::sample(&mut rng, self.classes.len(), n).into_vec();
        let mut episode = Episode {
            classes: Vec::with_capacity(n),
            support: Vec::with_capacity(n * k),
            support_labels: Vec::with_capacity(n * k),
            query: Vec::with_capacity(n * q),
            query_labels: Vec::with_capacity(n * q),
        };
        for (label, &c) in chosen.iter().enumerate() {
            let class = &self.classes[c];
            let draw = index::sample(&mut rng, class.items.len(), k + q);
            episode.classes.push(class.class);
            for (j, pos) in draw.into_iter().enumerate() {
                let (items, labels) = if j < k {
                    (&mut episode.support, &mut episode.support_labels)
                } else {
                    (&mut episode.query, &mut episode.query_labels)
                };
                items.push(class.items[pos]);
                labels.push(label);
            }
        }
        if self.config.shuffle_queries {
            let mut order: Vec<usize> = (0..episode.query.len()).collect();
            order.shuffle(&mut rng);
            episode.query = order.iter().map(|&i| episode.query[i]).collect();
            episode.query_labels = order.iter().map(|&i| episode.query_labels[i]).collect();
        }
        episode
    }

    /// Episodes `start..start + count`.
    pub fn episodes(&self, start: u64, count: usize) -> Vec<Episode> {
        (start..start + count as u64)
            .map(|i| self.episode(i))
            .collect()
    }
}

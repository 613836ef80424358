//! Transductive few-shot classification on frozen features (SSR, Shen et al., NeurIPS 2021,
//! Sec. 3.2 and Table 2).
//!
//! A backbone is trained on the base classes and frozen; test episodes (N-way, K-shot, Q queries
//! per class, [`crate::samplers::episodes`]) are drawn from the novel classes, their images are
//! embedded once, and an [`EpisodeClassifier`] labels each episode's queries from its support.
//! [`evaluate`] reports the mean accuracy over episodes with the 95% interval
//! (`1.96 · σ / √n`, [`crate::metrics::fewshot`]), in percent as SSR's code does.
//!
//! Classifiers (the rows of SSR Table 2 they correspond to):
//! * [`prototype::PrototypeClassifier`] — nearest class prototype (mean of the shots) by cosine:
//!   Table 2's "Baseline" rows (the nearest-neighbour classifier on pretrained features); with
//!   the squared Euclidean distance it is ProtoNet's rule (Snell et al. 2017, Table 2's ProtoNet
//!   row, which however meta-trains its backbone).
//! * [`crate::rerank::k_reciprocal::KReciprocalClassifier`] — "+ k-reciprocal": prototypes as the
//!   gallery, the episode's queries as the queries of k-reciprocal re-ranking, argmin of the final
//!   distance.
//! * [`soft_kmeans::SoftKMeansClassifier`] — a cheap transductive baseline not in Table 2: the
//!   prototypes refined by soft k-means over the queries (Ren et al., ICLR 2018).
//! * [`crate::rerank::ssr::SsrClassifier`] — SSR itself ("+ Ours"), through the same trait.
//!
//! The re-ranking classifiers live beside their re-rankers in [`crate::rerank`], which depends on
//! this module and never the reverse.
//!
//! [`backbone::quick_backbone_features`] builds the frozen features of the quick scale: the small
//! CNN trained on the base classes of the embedded shapes dataset, applied to its novel classes.

pub mod backbone;
pub mod prototype;
pub mod soft_kmeans;

pub use backbone::{
    all_split_features, quick_backbone_features, BackboneFeatures, QuickBackboneConfig,
    SplitFeatures,
};

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::metrics::fewshot::{accuracy_interval, episode_accuracy, AccuracyInterval};
use crate::samplers::episodes::{Episode, EpisodeConfig, EpisodeSampler};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

/// The features of one episode, with episode labels `0..n_way`.
#[derive(Debug, Clone)]
pub struct EpisodeFeatures {
    /// Support features, `N·K × D`.
    pub support: Tensor,
    /// Episode label of each support row.
    pub support_labels: Vec<usize>,
    /// Query features, `N·Q × D`.
    pub query: Tensor,
    /// Episode label of each query row (the truth, for scoring only).
    pub query_labels: Vec<usize>,
    /// N, the number of classes.
    pub n_way: usize,
}

impl EpisodeFeatures {
    /// Checks and assembles an episode. Errors if the tensors are not `rows × D` matrices of the
    /// same `D`, if the label counts differ from the rows, if a label is `≥ n_way`, or if a class
    /// has no support row.
    pub fn new(
        support: Tensor,
        support_labels: Vec<usize>,
        query: Tensor,
        query_labels: Vec<usize>,
        n_way: usize,
    ) -> Result<Self> {
        let (ds, dq) = (support.dims().to_vec(), query.dims().to_vec());
        if ds.len() != 2 || dq.len() != 2 || ds[1] != dq[1] {
            return Err(Error::Shape(format!(
                "support {ds:?} and query {dq:?} must be matrices with the same number of columns"
            )));
        }
        if ds[0] != support_labels.len() || dq[0] != query_labels.len() {
            return Err(Error::Shape(format!(
                "{} support rows with {} labels, {} query rows with {} labels",
                ds[0],
                support_labels.len(),
                dq[0],
                query_labels.len()
            )));
        }
        if n_way == 0 {
            return Err(Error::invalid("n_way", "must be ≥ 1"));
        }
        if let Some(&l) = support_labels
            .iter()
            .chain(&query_labels)
            .find(|&&l| l >= n_way)
        {
            return Err(Error::invalid(
                "labels",
                format!("episode label {l} is not below n_way = {n_way}"),
            ));
        }
        if let Some(c) = (0..n_way).find(|c| !support_labels.contains(c)) {
            return Err(Error::invalid(
                "support_labels",
                format!("class {c} has no support example"),
            ));
        }
        Ok(EpisodeFeatures {
            support,
            support_labels,
            query,
            query_labels,
            n_way,
        })
    }

    /// The episode's rows of `features` (`N × D`, row-major, `dim` columns) as f32 tensors.
    pub fn from_rows(features: &[f32], dim: usize, episode: &Episode) -> Result<Self> {
        let gather = |items: &[usize]| -> Result<Tensor> {
            let mut out = Vec::with_capacity(items.len() * dim);
            for &i in items {
                let row = features.get(i * dim..(i + 1) * dim).ok_or_else(|| {
                    Error::invalid(
                        "episode",
                        format!(
                            "item {i} is out of range for {} feature rows",
                            features.len() / dim.max(1)
                        ),
                    )
                })?;
                out.extend_from_slice(row);
            }
            Ok(Tensor::from_vec(out, (items.len(), dim), &Device::Cpu)?)
        };
        EpisodeFeatures::new(
            gather(&episode.support)?,
            episode.support_labels.clone(),
            gather(&episode.query)?,
            episode.query_labels.clone(),
            episode.classes.len(),
        )
    }

    /// Class prototypes, `n_way × D` (f64 rows): the mean of each class's support features, as
    /// SSR's code averages the shots (`SupportFeat.mean(1)`).
    pub fn prototypes(&self) -> Result<Vec<Vec<f64>>> {
        let support = rows_f64(&self.support)?;
        let dim = support.first().map_or(0, Vec::len);
        let mut sums = vec![vec![0.0; dim]; self.n_way];
        let mut counts = vec![0usize; self.n_way];
        for (row, &c) in support.iter().zip(&self.support_labels) {
            for (s, v) in sums[c].iter_mut().zip(row) {
                *s += v;
            }
            counts[c] += 1;
        }
        for (s, &n) in sums.iter_mut().zip(&counts) {
            for v in s.iter_mut() {
                *v /= n as f64;
            }
        }
        Ok(sums)
    }

    /// The query features as f64 rows.
    pub fn query_rows(&self) -> Result<Vec<Vec<f64>>> {
        rows_f64(&self.query)
    }
}

/// The rows of a matrix as f64 vectors; errors on non-finite entries.
pub(crate) fn rows_f64(t: &Tensor) -> Result<Vec<Vec<f64>>> {
    let rows = t
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .to_vec2::<f64>()?;
    if let Some(i) = rows.iter().position(|r| r.iter().any(|v| !v.is_finite())) {
        return Err(Error::invalid(
            "features",
            format!("row {i} contains NaN or infinity"),
        ));
    }
    Ok(rows)
}

/// The L2-normalised copy of `v` (a zero vector stays zero, as `F.normalize`).
pub(crate) fn normalized(v: &[f64]) -> Vec<f64> {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let s = if n > 1e-12 { 1.0 / n } else { 1.0 / 1e-12 };
    v.iter().map(|x| x * s).collect()
}

/// The index of the largest value, the first one on ties.
pub(crate) fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Classifies the queries of a few-shot episode.
pub trait EpisodeClassifier {
    /// The predicted episode label (`0..n_way`) of every query row, in order.
    fn predict(&self, ep: &EpisodeFeatures) -> Result<Vec<usize>>;
}

/// Accuracy (percent) of `classifier` on each of `n_episodes` episodes (episodes
/// `0..n_episodes` of an [`EpisodeSampler`] over `labels` with `config` and `seed`), from the
/// frozen `features` (`N × D`, one row per label row). Episodes run in parallel; the result
/// does not depend on the thread count.
pub fn episode_accuracies<C: EpisodeClassifier + Sync + ?Sized>(
    classifier: &C,
    features: &Tensor,
    labels: &Labels,
    config: &EpisodeConfig,
    n_episodes: usize,
    seed: u64,
) -> Result<Vec<f64>> {
    let dims = features.dims();
    if dims.len() != 2 || dims[0] != labels.len() {
        return Err(Error::Shape(format!(
            "features of shape {dims:?} for {} label rows",
            labels.len()
        )));
    }
    if n_episodes == 0 {
        return Err(Error::invalid("n_episodes", "must be ≥ 1"));
    }
    let sampler = EpisodeSampler::new(labels, config.clone(), seed)?;
    let dim = dims[1];
    let flat = features
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    (0..n_episodes as u64)
        .into_par_iter()
        .map(|e| {
            let episode = sampler.episode(e);
            let ep = EpisodeFeatures::from_rows(&flat, dim, &episode)?;
            let predicted = classifier.predict(&ep)?;
            Ok(100.0 * episode_accuracy(&predicted, &ep.query_labels)?)
        })
        .collect()
}

/// Mean accuracy (percent) ± 95% half-width over `n_episodes` episodes: SSR Table 2's protocol
/// (5-way, 1 or 5 shots, 15 queries per class, 2,000 episodes). See [`episode_accuracies`].
pub fn evaluate<C: EpisodeClassifier + Sync + ?Sized>(
    classifier: &C,
    features: &Tensor,
    labels: &Labels,
    config: &EpisodeConfig,
    n_episodes: usize,
    seed: u64,
) -> Result<AccuracyInterval> {
    accuracy_interval(&episode_accuracies(
        classifier, features, labels, config, n_episodes, seed,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episode_checks_and_prototypes() {
        let s = Tensor::new(&[[1.0f32, 0.0], [3.0, 0.0], [0.0, 2.0]], &Device::Cpu).unwrap();
        let q = Tensor::new(&[[1.0f32, 1.0]], &Device::Cpu).unwrap();
        let ep = EpisodeFeatures::new(s.clone(), vec![0, 0, 1], q.clone(), vec![1], 2).unwrap();
        assert_eq!(
            ep.prototypes().unwrap(),
            vec![vec![2.0, 0.0], vec![0.0, 2.0]]
        );
        assert!(EpisodeFeatures::new(s.clone(), vec![0, 0], q.clone(), vec![1], 2).is_err());
        assert!(EpisodeFeatures::new(s.clone(), vec![0, 0, 0], q.clone(), vec![1], 2).is_err());
        assert!(EpisodeFeatures::new(s.clone(), vec![0, 0, 2], q.clone(), vec![1], 2).is_err());
        let q3 = Tensor::new(&[[1.0f32, 1.0, 0.0]], &Device::Cpu).unwrap();
        assert!(EpisodeFeatures::new(s, vec![0, 0, 1], q3, vec![1], 2).is_err());
        assert_eq!(argmax(&[0.1, 0.5, 0.5]), 1);
        let n = normalized(&[3.0, 4.0]);
        assert!((n[0] - 0.6).abs() < 1e-15 && (n[1] - 0.8).abs() < 1e-15);
    }
}

//! "+ k-reciprocal" of SSR Table 2 (`transductive_few_shot/src/few_shot_kreciprocal.py`): the
//! class prototypes (mean of the shots, L2-normalised) are the gallery and the episode's
//! L2-normalised queries are the queries of k-reciprocal re-ranking
//! ([`super`]); each query takes the class of minimal final distance. Transductive: every
//! query's neighbourhood involves the other queries. It lives beside the re-ranker it wraps, as
//! SSR's classifier does ([`crate::rerank::ssr::SsrClassifier`]): `fewshot` defines episodes and
//! the [`EpisodeClassifier`] trait, the re-rankers implement it, and no import goes back.
//!
//! SSR picks `(k1, k2, λ)` from [`SSR_FEWSHOT_GRID`] by the mean accuracy **on the test
//! episodes themselves** (the script reports the best grid point); [`best_of_grid`] reproduces
//! that protocol, which is optimistic — select on validation classes for a fair number.

use super::KReciprocal;
use crate::error::{Error, Result};
use crate::fewshot::{argmax, evaluate, EpisodeClassifier, EpisodeFeatures};
use crate::hierarchy::Labels;
use crate::metrics::fewshot::AccuracyInterval;
use crate::samplers::episodes::EpisodeConfig;
use candle_core::{Device, Tensor};

/// SSR's few-shot grid: `k1 ∈ {10, 20, 30}`, `k2 ∈ {5, 10, 15}`, `λ ∈ {0.2, 0.5, 0.8}`.
pub const SSR_FEWSHOT_GRID: ([usize; 3], [usize; 3], [f64; 3]) =
    ([10, 20, 30], [5, 10, 15], [0.2, 0.5, 0.8]);

/// k-reciprocal re-ranking of the queries against the class prototypes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KReciprocalClassifier {
    /// The re-ranking parameters; `k1 + 1` and `k2` must not exceed queries + classes.
    pub params: KReciprocal,
}

impl EpisodeClassifier for KReciprocalClassifier {
    fn predict(&self, ep: &EpisodeFeatures) -> Result<Vec<usize>> {
        let prototypes = ep.prototypes()?;
        let dim = prototypes.first().map_or(0, Vec::len);
        let flat: Vec<f32> = prototypes.iter().flatten().map(|&v| v as f32).collect();
        let gallery = Tensor::from_vec(flat, (ep.n_way, dim), &Device::Cpu)?;
        let nq = ep.query_labels.len();
        let fitted = self.params.fit(&ep.query, Some(&gallery))?;
        let d = fitted.distances(0, nq)?;
        Ok(d.chunks(ep.n_way)
            .map(|row| argmax(&row.iter().map(|x| -x).collect::<Vec<_>>()))
            .collect())
    }
}

/// Every point of `grid` evaluated on the same episodes, and the best one by mean accuracy
/// (SSR's protocol, see the module documentation). Returns `(params, interval)` for each grid
/// point in order and the index of the best.
pub fn best_of_grid(
    grid: &[KReciprocal],
    features: &Tensor,
    labels: &Labels,
    config: &EpisodeConfig,
    n_episodes: usize,
    seed: u64,
) -> Result<(Vec<(KReciprocal, AccuracyInterval)>, usize)> {
    if grid.is_empty() {
        return Err(Error::invalid("grid", "needs at least one parameter set"));
    }
    let mut results = Vec::with_capacity(grid.len());
    for &params in grid {
        let acc = evaluate(
            &KReciprocalClassifier { params },
            features,
            labels,
            config,
            n_episodes,
            seed,
        )?;
        results.push((params, acc));
    }
    let best = argmax(&results.iter().map(|r| r.1.mean).collect::<Vec<_>>());
    Ok((results, best))
}

/// The 27 points of [`SSR_FEWSHOT_GRID`].
pub fn ssr_fewshot_grid() -> Vec<KReciprocal> {
    let (k1s, k2s, lambdas) = SSR_FEWSHOT_GRID;
    let mut grid = Vec::with_capacity(27);
    for k1 in k1s {
        for k2 in k2s {
            for lambda in lambdas {
                grid.push(KReciprocal { k1, k2, lambda });
            }
        }
    }
    grid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separable_episode_and_too_large_k1() {
        // Two classes on two well-separated directions, 1 shot and 4 queries each.
        let s = Tensor::new(&[[1.0f32, 0.05], [0.05, 1.0]], &Device::Cpu).unwrap();
        let q = Tensor::new(
            &[
                [1.0f32, 0.1],
                [0.1, 1.0],
                [0.9, 0.0],
                [0.0, 0.9],
                [1.0, 0.2],
                [0.2, 1.0],
                [0.95, 0.15],
                [0.1, 0.8],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let truth = vec![0, 1, 0, 1, 0, 1, 0, 1];
        let ep = EpisodeFeatures::new(s, vec![0, 1], q, truth.clone(), 2).unwrap();
        let c = KReciprocalClassifier {
            params: KReciprocal {
                k1: 3,
                k2: 2,
                lambda: 0.3,
            },
        };
        assert_eq!(c.predict(&ep).unwrap(), truth);
        // 10 nodes: k1 = 10 needs 11.
        let big = KReciprocalClassifier {
            params: KReciprocal {
                k1: 10,
                k2: 2,
                lambda: 0.3,
            },
        };
        assert!(big.predict(&ep).unwrap_err().to_string().contains("k1"));
        assert_eq!(ssr_fewshot_grid().len(), 27);
    }
}

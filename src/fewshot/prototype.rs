//! Nearest-prototype classification: SSR Table 2's "Baseline" (cosine) and ProtoNet's rule
//! (squared Euclidean; Snell et al., NeurIPS 2017).

use super::{argmax, normalized, EpisodeClassifier, EpisodeFeatures};
use crate::error::Result;

/// How a query is compared with a class prototype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrototypeMetric {
    /// Cosine similarity (SSR's baseline: `cos(prototype, query)`, the logits of its cosine
    /// classifier without the scale).
    #[default]
    Cosine,
    /// Negative squared Euclidean distance on the raw features (ProtoNet).
    SquaredEuclidean,
}

/// Predicts the class whose prototype (mean of its support features) is nearest; ties go to the
/// lowest class index. With one shot this is the nearest-neighbour classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrototypeClassifier {
    /// The comparison.
    pub metric: PrototypeMetric,
}

/// Scores (larger = nearer) of `query` against each prototype.
pub(crate) fn prototype_scores(
    metric: PrototypeMetric,
    prototypes: &[Vec<f64>],
    query: &[f64],
) -> Vec<f64> {
    match metric {
        PrototypeMetric::Cosine => {
            let q = normalized(query);
            prototypes
                .iter()
                .map(|p| normalized(p).iter().zip(&q).map(|(a, b)| a * b).sum())
                .collect()
        }
        PrototypeMetric::SquaredEuclidean => prototypes
            .iter()
            .map(|p| {
                -p.iter()
                    .zip(query)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f64>()
            })
            .collect(),
    }
}

impl EpisodeClassifier for PrototypeClassifier {
    fn predict(&self, ep: &EpisodeFeatures) -> Result<Vec<usize>> {
        let prototypes = ep.prototypes()?;
        Ok(ep
            .query_rows()?
            .iter()
            .map(|q| argmax(&prototype_scores(self.metric, &prototypes, q)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn cosine_and_euclidean_differ_as_expected() {
        // Class 0 prototype (1, 0); class 1 prototype (10, 10). The query (2, 1.5) is nearer to
        // class 0 in Euclidean distance but closer in angle to class 1; (8, 9) is class 1 by both.
        let s = Tensor::new(&[[1.0f32, 0.0], [10.0, 10.0]], &Device::Cpu).unwrap();
        let q = Tensor::new(&[[2.0f32, 1.5], [8.0, 9.0]], &Device::Cpu).unwrap();
        let ep = EpisodeFeatures::new(s, vec![0, 1], q, vec![0, 1], 2).unwrap();
        let cos = PrototypeClassifier::default().predict(&ep).unwrap();
        let euc = PrototypeClassifier {
            metric: PrototypeMetric::SquaredEuclidean,
        }
        .predict(&ep)
        .unwrap();
        assert_eq!(cos, vec![1, 1]);
        assert_eq!(euc, vec![0, 1]);
    }
}

//! Query expansion, the QE baselines of SSR Table 1, as SSR's `image_retrieval/test_ssr_QE.py`
//! computes them: each query is replaced by a weighted sum of itself and its `k` nearest
//! references (first-stage cosine ranking), L2-normalised, and the new query is scored against
//! the whole database by inner product.
//!
//! With `x_0 = q` and `x_1..x_k` the top-k references, best first:
//!
//! | method | weight of `x_r` | source |
//! |---|---|---|
//! | AQE (average QE; Chum et al. 2007) | 1 | SSR Table 1 "AQE" \[9\] |
//! | AQEwD (AQE with decay; Gordo et al. 2017) | `(k + 1 − r) / (k + 1)` | "AQeWd" \[16\] |
//! | αQE (Radenović et al. 2018) | `(qᵀx_r)^α`, `α = 3` (query weight 1) | "αQE" \[50\] |
//!
//! | DQE (discriminative QE; Arandjelović & Zisserman 2012) | the hard-margin linear SVM (with bias) separating `[q, x_1..x_k]` from the `k + 1` lowest-ranked references; the new query is its normalised `w` | "DQE" \[2\] |
//!
//! SSR sweeps `k ∈ {1, 3, 5, 7, 9}` ([`SSR_QE_NEIGHBOURS`]). The reference solves DQE's SVM
//! dual with cvxopt (tolerances 1e-10); here `w ∝ p* − n*`, the closest points of the two convex
//! hulls (the geometric form of the same hard-margin SVM), found exactly by Wolfe's
//! minimum-norm-point algorithm ([`super::min_norm_point`]). Database-side augmentation (DBA)
//! is not in SSR's tables and not implemented.
//!
//! Features are L2-normalised first (the landmark features the reference uses are unit
//! vectors), so `qᵀx_r` is a cosine. When the queries are the references themselves, each
//! query's own entry is excluded from its top-k (otherwise it would count twice).

use super::min_norm_point::min_norm_point;
use super::{CosineRanking, Reranker};
use crate::error::{Error, Result};
use crate::retrieval::{knn, prepare, SelfMatch, Similarity};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// The neighbour counts SSR's `run_QE.sh` sweeps.
pub const SSR_QE_NEIGHBOURS: [usize; 5] = [1, 3, 5, 7, 9];

/// How the query and its neighbours are weighted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weighting {
    /// AQE: every vector weight 1.
    Average,
    /// AQEwD: `x_r` weighted `(k + 1 − r) / (k + 1)`, the query 1.
    AverageWithDecay,
    /// αQE: `x_r` weighted `(qᵀx_r)^α` (the query `1^α = 1`).
    Alpha(f64),
    /// DQE: the normalised weight vector of the hard-margin SVM separating the query and its
    /// top-k from the bottom `k + 1` references ([`dqe`]).
    Svm,
}

/// A query-expansion method (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryExpansion {
    /// Number of top-ranked references added to the query.
    pub k: usize,
    /// Their weights.
    pub weighting: Weighting,
}

impl QueryExpansion {
    /// AQE with `k` neighbours.
    pub fn aqe(k: usize) -> Self {
        QueryExpansion {
            k,
            weighting: Weighting::Average,
        }
    }

    /// AQEwD with `k` neighbours.
    pub fn aqe_with_decay(k: usize) -> Self {
        QueryExpansion {
            k,
            weighting: Weighting::AverageWithDecay,
        }
    }

    /// αQE with `k` neighbours and SSR's `α = 3`.
    pub fn alpha_qe(k: usize) -> Self {
        QueryExpansion {
            k,
            weighting: Weighting::Alpha(3.0),
        }
    }

    /// DQE with `k` neighbours (and `k + 1` negatives).
    pub fn dqe(k: usize) -> Self {
        QueryExpansion {
            k,
            weighting: Weighting::Svm,
        }
    }

    /// Errors unless `k ≥ 1` and `α` is finite.
    pub fn validate(&self) -> Result<()> {
        if self.k == 0 {
            return Err(Error::invalid(
                "k",
                "query expansion needs k ≥ 1 neighbours",
            ));
        }
        if let Weighting::Alpha(a) = self.weighting {
            if !a.is_finite() {
                return Err(Error::invalid("alpha", format!("must be finite, got {a}")));
            }
        }
        Ok(())
    }

    /// The expanded, L2-normalised queries (`Q × D`, f32): each query combined with its `k`
    /// nearest references by cosine (the query itself excluded when `references` is `None`).
    ///
    /// Errors on bad features, `k` larger than the references a query can retrieve, or an αQE
    /// weight that is not a real number (a negative similarity to a non-integer power).
    pub fn expanded_queries(
        &self,
        queries: &Tensor,
        references: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.validate()?;
        let (refs, self_match) = match references {
            Some(r) => (r, SelfMatch::None),
            None => (queries, SelfMatch::SameIndex),
        };
        let ops = prepare(queries, refs, Similarity::Cosine, &Device::Cpu)?;
        let top = knn(&ops.queries, &ops.references, self.k, self_match, 128)?;
        // DQE's negatives: the k + 1 least similar references (best matches of −reference).
        let bottom = match self.weighting {
            Weighting::Svm => Some(knn(
                &ops.queries,
                &ops.references.neg()?,
                self.k + 1,
                self_match,
                128,
            )?),
            _ => None,
        };
        let dim = ops.queries.dims()[1];
        let q = ops.queries.flatten_all()?.to_vec1::<f32>()?;
        let r = ops.references.flatten_all()?.to_vec1::<f32>()?;
        let rows: Vec<Vec<f32>> = (0..ops.num_queries)
            .into_par_iter()
            .map(|i| {
                let rows = |list: &[u32]| -> Vec<&[f32]> {
                    list.iter()
                        .map(|&j| &r[j as usize * dim..(j as usize + 1) * dim])
                        .collect()
                };
                let query = &q[i * dim..(i + 1) * dim];
                let neighbours = rows(top.neighbours(i));
                match &bottom {
                    Some(b) => dqe(query, &neighbours, &rows(b.neighbours(i))),
                    None => expand(query, &neighbours, self.weighting),
                }
                .map_err(|e| Error::invalid("queries", format!("query {i}: {e}")))
            })
            .collect::<Result<_>>()?;
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        Ok(Tensor::from_vec(
            flat,
            (ops.num_queries, dim),
            &Device::Cpu,
        )?)
    }

    /// The expanded queries scored against the references: a [`Reranker`].
    pub fn fit(&self, queries: &Tensor, references: Option<&Tensor>) -> Result<ExpandedQueries> {
        let expanded = self.expanded_queries(queries, references)?;
        // The references normalised as by the first stage (inner products of unit vectors); the
        // expanded queries are already unit (or zero) vectors.
        Ok(ExpandedQueries {
            cosine: CosineRanking::new(queries, references)?.with_queries(expanded)?,
        })
    }
}

/// One expanded query: `normalize(Σ_r w_r x_r)` over `[query, neighbours...]` with the weights
/// of `weighting` (module documentation). Like scikit-learn's `normalize`, a zero sum stays
/// zero. Errors if an αQE weight is not a real number, or for [`Weighting::Svm`] (use [`dqe`],
/// which also needs negatives).
pub fn expand(query: &[f32], neighbours: &[&[f32]], weighting: Weighting) -> Result<Vec<f32>> {
    let k = neighbours.len();
    let dot =
        |a: &[f32], b: &[f32]| -> f64 { a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum() };
    let mut sum = vec![0.0f64; query.len()];
    let vectors = std::iter::once(query).chain(neighbours.iter().copied());
    for (r, x) in vectors.enumerate() {
        if x.len() != query.len() {
            return Err(Error::Shape(format!(
                "neighbour {r} has dimension {}, the query {}",
                x.len(),
                query.len()
            )));
        }
        let w = match weighting {
            Weighting::Average => 1.0,
            Weighting::AverageWithDecay => (k + 1 - r) as f64 / (k + 1) as f64,
            Weighting::Alpha(alpha) => {
                let s = dot(query, x);
                let w = if alpha.fract() == 0.0 && alpha.abs() < i32::MAX as f64 {
                    s.powi(alpha as i32)
                } else {
                    s.powf(alpha)
                };
                if !w.is_finite() {
                    return Err(Error::invalid(
                        "alpha",
                        format!(
                            "similarity {s} to the power {alpha} is not a real number (vector {r})"
                        ),
                    ));
                }
                w
            }
            Weighting::Svm => {
                return Err(Error::invalid(
                    "weighting",
                    "DQE needs negatives: call `query_expansion::dqe`",
                ))
            }
        };
        for (acc, &v) in sum.iter_mut().zip(x) {
            *acc += w * v as f64;
        }
    }
    let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 1.0 };
    Ok(sum.into_iter().map(|v| (v * scale) as f32).collect())
}

/// DQE's new query: the hard-margin linear SVM (with bias) separating the positives
/// `[query, neighbours...]` from `negatives`, whose weight vector is `w ∝ p* − n*` for the
/// closest points `p*`, `n*` of the two convex hulls; returns `normalize(w)`.
///
/// Errors if the two sets are not linearly separable (the hulls meet: the hard-margin SVM has
/// no solution), if `negatives` is empty, or on mismatched dimensions.
pub fn dqe(query: &[f32], neighbours: &[&[f32]], negatives: &[&[f32]]) -> Result<Vec<f32>> {
    if negatives.is_empty() {
        return Err(Error::invalid(
            "negatives",
            "DQE needs at least one negative",
        ));
    }
    let positives: Vec<&[f32]> = std::iter::once(query)
        .chain(neighbours.iter().copied())
        .collect();
    if let Some(bad) = positives
        .iter()
        .chain(negatives)
        .find(|x| x.len() != query.len())
    {
        return Err(Error::Shape(format!(
            "a DQE vector has dimension {}, the query {}",
            bad.len(),
            query.len()
        )));
    }
    let differences: Vec<Vec<f64>> = positives
        .iter()
        .flat_map(|p| {
            negatives.iter().map(move |n| {
                p.iter()
                    .zip(n.iter())
                    .map(|(&a, &b)| a as f64 - b as f64)
                    .collect()
            })
        })
        .collect();
    let (_, w) = min_norm_point(&differences)?;
    let norm2: f64 = w.iter().map(|v| v * v).sum();
    let scale = differences
        .iter()
        .map(|d| d.iter().map(|v| v * v).sum::<f64>())
        .fold(0.0, f64::max);
    if norm2 <= 1e-12 * scale {
        return Err(Error::invalid(
            "queries",
            "DQE: the query and its top-k are not linearly separable from the negatives",
        ));
    }
    let s = 1.0 / norm2.sqrt();
    Ok(w.into_iter().map(|v| (v * s) as f32).collect())
}

/// Expanded queries scored against the references by inner product (unit vectors: cosine).
pub struct ExpandedQueries {
    cosine: CosineRanking,
}

impl ExpandedQueries {
    /// The expanded queries (`Q × D`, unit rows).
    pub fn queries(&self) -> &Tensor {
        self.cosine.queries()
    }
}

impl Reranker for ExpandedQueries {
    fn num_queries(&self) -> usize {
        self.cosine.num_queries()
    }
    fn num_references(&self) -> usize {
        self.cosine.num_references()
    }
    fn queries_are_references(&self) -> bool {
        self.cosine.queries_are_references()
    }
    fn scores(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        self.cosine.scores(start, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((*x as f64 - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn hand_worked_expansions() {
        let q = [1.0f32, 0.0];
        let x1 = [0.6f32, 0.8];
        let x2 = [0.0f32, 1.0];
        let n = [&x1[..], &x2[..]];
        // AQE: q + x1 + x2 = (1.6, 1.8), norm √5.8.
        let s = 5.8f64.sqrt();
        close(
            &expand(&q, &n, Weighting::Average).unwrap(),
            &[1.6 / s, 1.8 / s],
        );
        // AQEwD, k = 2: weights 1, 2/3, 1/3 → (1 + 0.4, 0.5333 + 0.3333).
        let (a, b) = (1.4f64, 0.8 * 2.0 / 3.0 + 1.0 / 3.0);
        let s = (a * a + b * b).sqrt();
        close(
            &expand(&q, &n, Weighting::AverageWithDecay).unwrap(),
            &[a / s, b / s],
        );
        // αQE, α = 3: weights 1, 0.6³ = 0.216, 0³ = 0 → (1.1296, 0.1728).
        let (a, b): (f64, f64) = (1.0 + 0.216 * 0.6, 0.216 * 0.8);
        let s = (a * a + b * b).sqrt();
        close(
            &expand(&q, &n, Weighting::Alpha(3.0)).unwrap(),
            &[a / s, b / s],
        );
        // A negative similarity to an odd integer power is negative, as numpy's `**`.
        let neg = [-0.6f32, 0.8];
        let e = expand(&q, &[&neg[..]], Weighting::Alpha(3.0)).unwrap();
        let (a, b): (f64, f64) = (1.0 - 0.216 * -0.6, -0.216 * 0.8);
        let s = (a * a + b * b).sqrt();
        close(&e, &[a / s, b / s]);
        assert!(expand(&q, &[&neg[..]], Weighting::Alpha(2.5)).is_err());
        assert!(expand(&q, &[&[1.0f32][..]], Weighting::Average).is_err());
    }

    #[test]
    fn dqe_hand_case() {
        // Positives q = (1, 0), x1 = (1, 1); negative (-1, 0). The closest points of the hulls
        // are (1, 0) and (-1, 0): w ∝ (2, 0), the new query (1, 0).
        let got = dqe(&[1.0, 0.0], &[&[1.0, 1.0][..]], &[&[-1.0, 0.0][..]]).unwrap();
        close(&got, &[1.0, 0.0]);
        // Negatives (0, 2) and (2, 2): the closest points are (1, 1) (on the positive segment)
        // and (1, 2), so w ∝ (0, -1).
        let got = dqe(
            &[1.0, 0.0],
            &[&[1.0, 1.0][..]],
            &[&[0.0, 2.0][..], &[2.0, 2.0][..]],
        )
        .unwrap();
        close(&got, &[0.0, -1.0]);
        // Overlapping sets have no hard-margin separator.
        assert!(dqe(&[1.0, 0.0], &[], &[&[1.0, 0.0][..]]).is_err());
        assert!(dqe(&[1.0, 0.0], &[], &[]).is_err());
        assert!(expand(&[1.0, 0.0], &[], Weighting::Svm).is_err());
    }

    #[test]
    fn expansion_reranks_the_database() {
        let r = Tensor::new(
            &[[1.0f32, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]],
            &Device::Cpu,
        )
        .unwrap();
        let q = Tensor::new(&[[2.0f32, 0.2]], &Device::Cpu).unwrap();
        let qe = QueryExpansion::aqe(1).fit(&q, Some(&r)).unwrap();
        // Top-1 of q is reference 0; the new query is normalize(q̂ + r0).
        let got = qe.queries().to_vec2::<f32>().unwrap();
        let qn = [2.0 / 4.04f64.sqrt(), 0.2 / 4.04f64.sqrt()];
        let (a, b) = (qn[0] + 1.0, qn[1]);
        let s = (a * a + b * b).sqrt();
        close(&got[0], &[a / s, b / s]);
        let scores = qe.scores(0, 1).unwrap();
        assert_eq!(scores.len(), 4);
        assert!((scores[0] as f64 - a / s).abs() < 1e-6);
        // Self mode excludes the query from its own top-k.
        let own = QueryExpansion::aqe(1).expanded_queries(&r, None).unwrap();
        let own = own.to_vec2::<f32>().unwrap();
        // Reference 0's nearest other is reference 1: normalize((1, 0) + (0.8, 0.6)).
        let s = (1.8f64 * 1.8 + 0.36).sqrt();
        close(&own[0], &[1.8 / s, 0.6 / s]);
        assert!(QueryExpansion::aqe(0).fit(&q, Some(&r)).is_err());
        assert!(QueryExpansion::aqe(4).fit(&r, None).is_err());
        assert!(QueryExpansion {
            k: 1,
            weighting: Weighting::Alpha(f64::NAN)
        }
        .validate()
        .is_err());
    }
}

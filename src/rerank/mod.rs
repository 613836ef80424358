//! Re-ranking: second-stage methods that re-order a first retrieval, the baselines of SSR
//! (Shen et al., NeurIPS 2021) Table 1 and Table 2.
//!
//! * [`k_reciprocal`]: k-reciprocal encoding with Jaccard distance (Zhong et al., CVPR 2017;
//!   SSR Sec. 2.3, Eqs. 8–9), exactly as the `re_ranking` code SSR uses.
//! * [`query_expansion`]: AQE, AQEwD, αQE and DQE (SSR Table 1) — a new query from the query
//!   and its top-k neighbours, re-scored against the whole database ([`min_norm_point`] solves
//!   DQE's SVM).
//! * SSR itself lives in `rerank::ssr` (a separate module).
//! * [`method`]: the methods above that need no training, named by a short string
//!   (`rankwise eval --rerank aqe:3`).
//! * [`episode_method`]: SSR Table 2's few-shot classifiers named the same way
//!   (`rankwise fewshot --classifier k-reciprocal:grid`), compared on shared episodes.
//!
//! Every re-ranker here is a [`Reranker`]: it produces, chunk by chunk, a score (larger is
//! better) of every query against every reference, so that the crate's one evaluation engine
//! ([`crate::retrieval::evaluate_scores`], through [`Reranker::evaluate`]) can rank each
//! query's whole reference list and score it without materialising the `Q × G` matrix, and [`TopN`]
//! can cut the re-ranked list to the top N that SSR refines ("SSR is then applied to the top-N of
//! the re-ranked list").
//!
//! Convention shared with [`crate::retrieval`]: when the queries are the references themselves
//! (the SOP/CUB/Cars protocol), query `i` is reference `i` and is removed from its own list.

pub mod episode_method;
pub mod k_reciprocal;
pub mod method;
pub mod min_norm_point;
pub mod query_expansion;
pub mod rankings;
pub mod ssr;

pub use episode_method::EpisodeMethod;
pub use method::RerankMethod;
pub use rankings::{evaluate_revisited, rankings};

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::retrieval::{
    evaluate_scores, knn, prepare, EvalOptions, EvalReport, Knn, ScoreChunk, ScoreSource,
    SelfMatch, Similarity,
};
use candle_core::{Device, Tensor};

/// A second-stage ranking of every query against every reference.
///
/// `scores(start, len)` returns the `len × num_references()` scores of queries
/// `start..start + len`, row-major, larger = ranked first. For distance-based methods the score
/// is the negated distance. Implementations are deterministic.
pub trait Reranker: Sync {
    /// Number of queries.
    fn num_queries(&self) -> usize;
    /// Number of references.
    fn num_references(&self) -> usize;
    /// Whether query `i` is reference `i` (and must be removed from its own list).
    fn queries_are_references(&self) -> bool;
    /// Scores of queries `start..start + len` against every reference (row-major).
    fn scores(&self, start: usize, len: usize) -> Result<Vec<f32>>;

    /// The metrics of `opts` for this re-ranking, from the crate's one evaluation engine
    /// ([`evaluate_scores`]): mAP@R, mAP, R@k, … at the fine level (every level with
    /// [`EvalOptions::per_level`]), H-AP, ASI and NDCG with [`EvalOptions::hierarchical`].
    /// `reference_labels` is `None` when the queries are the references, and each query is
    /// then removed from its own list (`opts.self_match` is set from the re-ranker).
    ///
    /// Errors if the queries-are-references setting disagrees with `reference_labels`, if the
    /// label counts do not match the re-ranker's sizes, on invalid options and on a non-finite
    /// score.
    fn evaluate(
        &self,
        query_labels: &Labels,
        reference_labels: Option<&Labels>,
        opts: &EvalOptions,
    ) -> Result<EvalReport> {
        let same = self.queries_are_references();
        if same != reference_labels.is_none() {
            return Err(Error::invalid(
                "reference_labels",
                if same {
                    "the re-ranker ranks the queries against themselves: pass no reference labels"
                } else {
                    "the re-ranker has separate references: pass their labels"
                },
            ));
        }
        let opts = EvalOptions {
            self_match: if same {
                SelfMatch::SameIndex
            } else {
                SelfMatch::None
            },
            ..opts.clone()
        };
        evaluate_scores(
            self,
            query_labels,
            reference_labels.unwrap_or(query_labels),
            &opts,
        )
    }
}

/// Every re-ranker is a score source of the evaluation engine: its chunk of scores, checked
/// to be the right size and range (the engine checks that they are finite).
impl<R: Reranker + ?Sized> ScoreSource for R {
    fn num_queries(&self) -> usize {
        Reranker::num_queries(self)
    }
    fn num_references(&self) -> usize {
        Reranker::num_references(self)
    }
    fn chunk_scores(&self, start: usize, len: usize, chunk: &mut ScoreChunk) -> Result<()> {
        check_chunk(self, start, len)?;
        chunk.set(self.scores(start, len)?);
        Ok(())
    }
}

/// No re-ranking: cosine similarity of the features ("Feat. only" in SSR Table 1), the
/// reference point of every re-ranker.
pub struct CosineRanking {
    queries: Tensor,
    references: Tensor,
    same: bool,
}

impl CosineRanking {
    /// Cosine scores of `queries` against `references`, or against themselves (each query
    /// removed from its own list) when `references` is `None`. Errors on non-matrix, non-finite
    /// or dimension-mismatched features.
    pub fn new(queries: &Tensor, references: Option<&Tensor>) -> Result<Self> {
        let refs = references.unwrap_or(queries);
        let ops = prepare(queries, refs, Similarity::Cosine, &Device::Cpu)?;
        Ok(CosineRanking {
            queries: ops.queries,
            references: ops.references,
            same: references.is_none(),
        })
    }
}

impl CosineRanking {
    /// The normalised queries (`Q × D`).
    pub(crate) fn queries(&self) -> &Tensor {
        &self.queries
    }

    /// The normalised references (`N_r × D`).
    pub(crate) fn references(&self) -> &Tensor {
        &self.references
    }

    /// The same references and self-match with other (already normalised) queries: the
    /// bookkeeping every cosine-based re-ranker shares (query expansion swaps the queries, SSR
    /// overwrites the scores of each top-k).
    pub(crate) fn with_queries(self, queries: Tensor) -> Result<Self> {
        if queries.dims() != self.queries.dims() {
            return Err(Error::Shape(format!(
                "{:?} queries to replace {:?}",
                queries.dims(),
                self.queries.dims()
            )));
        }
        Ok(CosineRanking { queries, ..self })
    }
}

impl Reranker for CosineRanking {
    fn num_queries(&self) -> usize {
        self.queries.dims()[0]
    }
    fn num_references(&self) -> usize {
        self.references.dims()[0]
    }
    fn queries_are_references(&self) -> bool {
        self.same
    }
    fn scores(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        check_chunk(self, start, len)?;
        cosine_chunk(&self.queries, &self.references, start, len)
    }
}

/// `len × N_r` inner products of rows `start..start + len` of `queries` (already normalised)
/// with every row of `references`, as a row-major vector.
pub(crate) fn cosine_chunk(
    queries: &Tensor,
    references: &Tensor,
    start: usize,
    len: usize,
) -> Result<Vec<f32>> {
    let s = queries
        .narrow(0, start, len)?
        .matmul(&references.t()?)?
        .flatten_all()?;
    Ok(s.to_vec1::<f32>()?)
}

/// Errors if `start..start + len` is not a range of queries of `r`.
pub(crate) fn check_chunk(r: &(impl Reranker + ?Sized), start: usize, len: usize) -> Result<()> {
    if start
        .checked_add(len)
        .is_none_or(|end| end > r.num_queries())
    {
        return Err(Error::invalid(
            "start",
            format!(
                "queries {start}..{} out of range for {} queries",
                start.saturating_add(len),
                r.num_queries()
            ),
        ));
    }
    Ok(())
}

/// The top-`n` references of every query, best first: what SSR re-ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct TopN {
    /// References kept per query.
    pub n: usize,
    /// Reference indices, row-major `Q × n`.
    pub indices: Vec<u32>,
    /// Their scores (cosine similarity for [`TopN::from_features`], the re-ranker's score for
    /// [`TopN::from_reranker`]), row-major `Q × n`, non-increasing along a row.
    pub similarities: Vec<f32>,
}

impl TopN {
    /// The exact top-`n` cosine neighbours of each query (the exact engine
    /// [`crate::retrieval::knn`]; ties by reference index). With `references = None` the
    /// queries are their own references and each query is removed from its own list.
    ///
    /// Errors if `n` is 0 or more than the references a query can retrieve, or on bad features.
    pub fn from_features(queries: &Tensor, references: Option<&Tensor>, n: usize) -> Result<Self> {
        let (refs, self_match) = match references {
            Some(r) => (r, SelfMatch::None),
            None => (queries, SelfMatch::SameIndex),
        };
        Ok(Self::from(knn(queries, refs, n, self_match, 128)?))
    }

    /// The top-`n` references of each query under a re-ranker's scores (ties by reference
    /// index; the query itself removed when the queries are the references).
    pub fn from_reranker(reranker: &dyn Reranker, n: usize) -> Result<Self> {
        let available = reranker.num_references() - usize::from(reranker.queries_are_references());
        if n == 0 || n > available {
            return Err(Error::invalid(
                "n",
                format!("must be between 1 and {available} (the references each query can retrieve), got {n}"),
            ));
        }
        let mut indices = Vec::with_capacity(reranker.num_queries() * n);
        let mut similarities = Vec::with_capacity(reranker.num_queries() * n);
        rankings::for_each_ranking(reranker, 128, |_, ranking, scores| {
            for &j in &ranking[..n] {
                indices.push(j);
                similarities.push(scores[j as usize]);
            }
            Ok(())
        })?;
        Ok(TopN {
            n,
            indices,
            similarities,
        })
    }

    /// Number of queries.
    pub fn num_queries(&self) -> usize {
        self.indices.len().checked_div(self.n).unwrap_or(0)
    }

    /// Reference indices of query `i`, best first.
    pub fn row_indices(&self, i: usize) -> &[u32] {
        &self.indices[i * self.n..(i + 1) * self.n]
    }

    /// Scores of query `i`'s references, best first.
    pub fn row_similarities(&self, i: usize) -> &[f32] {
        &self.similarities[i * self.n..(i + 1) * self.n]
    }
}

impl From<Knn> for TopN {
    fn from(knn: Knn) -> Self {
        TopN {
            n: knn.k,
            indices: knn.indices,
            similarities: knn.scores,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_n_from_features_and_from_reranker_agree() {
        let x = Tensor::new(
            &[
                [1.0f32, 0.0],
                [0.9, 0.1],
                [0.0, 1.0],
                [0.2, 0.8],
                [-1.0, 0.1],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let a = TopN::from_features(&x, None, 3).unwrap();
        assert_eq!(a.num_queries(), 5);
        assert_eq!(a.row_indices(0), &[1, 3, 2]);
        let cos = CosineRanking::new(&x, None).unwrap();
        let b = TopN::from_reranker(&cos, 3).unwrap();
        assert_eq!(a.indices, b.indices);
        for (s, t) in a.similarities.iter().zip(&b.similarities) {
            assert!((s - t).abs() < 1e-6);
        }
        assert!(TopN::from_reranker(&cos, 5).is_err());
        assert!(TopN::from_features(&x, None, 0).is_err());
        assert!(cos.scores(4, 2).is_err());
    }
}

//! Scoring a [`Reranker`] with the crate's metrics: the protocols of SSR Table 1 — mAP@R (and
//! mAP, R@k) for CUB / Cars / SOP, where every item is a query against all the others, and the
//! revisited Oxford/Paris mAP (Medium / Hard) for landmarks.
//!
//! Each query's whole reference list is ranked (decreasing score, ties by reference index, as
//! [`crate::retrieval::order`]), a chunk of queries at a time, so memory stays
//! `O(chunk × N_r)` except for [`rankings`] and [`evaluate_revisited`], which keep every full
//! ranking (`Q × N_r` indices — fine for the 70 queries of rOxford/rParis).

use super::Reranker;
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::metrics;
use crate::metrics::revisited::{self, GroundTruth, Protocol, RevisitedReport};
use crate::retrieval::order::{descending_key, sort_by_key_stable, RadixScratch};
use crate::retrieval::{EvalReport, MetricRow};
use rayon::prelude::*;

/// Which metrics [`evaluate`] computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankEvalOptions {
    /// The `k` of R@k (recall rate: a positive among the first k).
    pub recall_ks: Vec<usize>,
    /// Compute the metrics for every label column (positives = same class at that column), not
    /// only the finest.
    pub per_level: bool,
    /// Queries ranked at a time; the working set is `chunk_size × N_r` scores.
    pub chunk_size: usize,
}

impl Default for RerankEvalOptions {
    /// R@{1, 2, 4, 8} (the CUB/Cars convention), fine level only, chunks of 128 queries.
    fn default() -> Self {
        RerankEvalOptions {
            recall_ks: vec![1, 2, 4, 8],
            per_level: false,
            chunk_size: 128,
        }
    }
}

/// Runs `f(query, ranking, scores)` for every query in order, where `ranking` holds the
/// reference indices by decreasing score (the query itself removed when the queries are the
/// references) and `scores` the query's row of scores (indexed by reference).
pub(crate) fn for_each_ranking(
    reranker: &dyn Reranker,
    chunk_size: usize,
    mut f: impl FnMut(usize, &[u32], &[f32]) -> Result<()>,
) -> Result<()> {
    if chunk_size == 0 {
        return Err(Error::invalid("chunk_size", "must be at least 1"));
    }
    let nq = reranker.num_queries();
    let nr = reranker.num_references();
    let same = reranker.queries_are_references();
    let mut start = 0;
    while start < nq {
        let len = chunk_size.min(nq - start);
        let scores = reranker.scores(start, len)?;
        if scores.len() != len * nr {
            return Err(Error::Shape(format!(
                "the re-ranker returned {} scores for {len} queries × {nr} references",
                scores.len()
            )));
        }
        if let Some(bad) = scores.iter().position(|s| !s.is_finite()) {
            return Err(Error::invalid(
                "scores",
                format!(
                    "query {}, reference {}: the re-ranker gave a non-finite score",
                    start + bad / nr,
                    bad % nr
                ),
            ));
        }
        let ranked: Vec<Vec<u32>> = scores
            .par_chunks(nr)
            .enumerate()
            .map_init(RadixScratch::default, |scratch, (r, row)| {
                let skip = same.then_some(start + r);
                rank_row(row, skip, scratch)
            })
            .collect();
        for (r, ranking) in ranked.iter().enumerate() {
            f(start + r, ranking, &scores[r * nr..(r + 1) * nr])?;
        }
        start += len;
    }
    Ok(())
}

/// Reference indices of `row` by decreasing score, ties by index, without `skip`.
fn rank_row(row: &[f32], skip: Option<usize>, scratch: &mut RadixScratch<u32>) -> Vec<u32> {
    let mut keys = Vec::with_capacity(row.len());
    let mut order = Vec::with_capacity(row.len());
    for (j, &s) in row.iter().enumerate() {
        if Some(j) != skip {
            keys.push(descending_key(s));
            order.push(j as u32);
        }
    }
    sort_by_key_stable(&mut keys, &mut order, scratch);
    order
}

/// Every query's full ranking of the references (indices, best first; the query itself
/// removed when the queries are the references). Memory `Q × N_r` indices.
pub fn rankings(reranker: &dyn Reranker) -> Result<Vec<Vec<u32>>> {
    let mut all = Vec::with_capacity(reranker.num_queries());
    for_each_ranking(reranker, 128, |_, ranking, _| {
        all.push(ranking.to_vec());
        Ok(())
    })?;
    Ok(all)
}

/// One binary metric of a ranked list of levels.
#[derive(Debug, Clone, Copy)]
enum Metric {
    Map,
    MapAtR,
    RPrecision,
    RecallAt(usize),
}

impl Metric {
    fn name(self) -> String {
        match self {
            Metric::Map => "mAP".into(),
            Metric::MapAtR => "mAP@R".into(),
            Metric::RPrecision => "R-precision".into(),
            Metric::RecallAt(k) => format!("R@{k}"),
        }
    }

    fn score(self, ranked: &[u8], min_level: u8) -> Option<f64> {
        match self {
            Metric::Map => metrics::average_precision(ranked, min_level),
            Metric::MapAtR => metrics::map_at_r(ranked, min_level),
            Metric::RPrecision => metrics::r_precision(ranked, min_level),
            Metric::RecallAt(k) => metrics::recall_at_k(ranked, min_level, k),
        }
    }
}

/// mAP, mAP@R (SSR Table 1's metric for CUB / Cars / SOP), R-precision and R@k of a re-ranker,
/// averaged over the queries that have a positive (lone queries are skipped and counted, as in
/// [`crate::retrieval::evaluate`], whose report type and metric names this returns).
///
/// `reference_labels` is `None` when the queries are the references. Errors if the label
/// counts do not match the re-ranker's sizes, if the queries-are-references setting disagrees
/// with `reference_labels`, or if a `k` is 0.
pub fn evaluate(
    reranker: &dyn Reranker,
    query_labels: &Labels,
    reference_labels: Option<&Labels>,
    opts: &RerankEvalOptions,
) -> Result<EvalReport> {
    let same = reranker.queries_are_references();
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
    let refs = reference_labels.unwrap_or(query_labels);
    query_labels.check_compatible(refs)?;
    if query_labels.len() != reranker.num_queries() {
        return Err(Error::Shape(format!(
            "{} query label rows for {} queries",
            query_labels.len(),
            reranker.num_queries()
        )));
    }
    if refs.len() != reranker.num_references() {
        return Err(Error::Shape(format!(
            "{} reference label rows for {} references",
            refs.len(),
            reranker.num_references()
        )));
    }
    if opts.recall_ks.contains(&0) {
        return Err(Error::invalid("recall_ks", "every k must be ≥ 1"));
    }
    let num_levels = query_labels.num_levels();
    let columns = if opts.per_level { num_levels } else { 1 };
    let mut specs: Vec<(Metric, usize)> = Vec::new();
    for c in 0..columns {
        for m in [Metric::Map, Metric::MapAtR, Metric::RPrecision] {
            specs.push((m, c));
        }
        specs.extend(opts.recall_ks.iter().map(|&k| (Metric::RecallAt(k), c)));
    }
    let m = specs.len();
    let nq = reranker.num_queries();
    let mut per_query = vec![f64::NAN; nq * m];
    let mut levels = Vec::with_capacity(refs.len());
    for_each_ranking(reranker, opts.chunk_size, |q, ranking, _| {
        levels.clear();
        levels.extend(
            ranking
                .iter()
                .map(|&j| query_labels.level_against(q, refs, j as usize)),
        );
        for (o, &(metric, c)) in per_query[q * m..(q + 1) * m].iter_mut().zip(&specs) {
            let min_level = (num_levels - c) as u8;
            *o = metric.score(&levels, min_level).unwrap_or(f64::NAN);
        }
        Ok(())
    })?;
    let rows = specs
        .iter()
        .enumerate()
        .map(|(s, &(metric, c))| {
            let (mut sum, mut count) = (0.0, 0usize);
            for q in 0..nq {
                let v = per_query[q * m + s];
                if !v.is_nan() {
                    sum += v;
                    count += 1;
                }
            }
            MetricRow {
                metric: metric.name(),
                level: Some(c),
                value: if count > 0 {
                    sum / count as f64
                } else {
                    f64::NAN
                },
                queries: count,
                skipped: nq - count,
            }
        })
        .collect();
    Ok(EvalReport {
        num_queries: nq,
        num_references: reranker.num_references() - usize::from(same),
        rows,
        per_query,
    })
}

/// The revisited Oxford/Paris mAP (and mP@k at `kappas`) of a re-ranker for each protocol
/// (SSR Table 1 uses [`Protocol::Medium`] and [`Protocol::Hard`]), computed by
/// [`revisited::evaluate`] on the re-ranker's full rankings.
pub fn evaluate_revisited(
    reranker: &dyn Reranker,
    gnd: &[GroundTruth],
    protocols: &[Protocol],
    kappas: &[usize],
) -> Result<Vec<RevisitedReport>> {
    if gnd.len() != reranker.num_queries() {
        return Err(Error::Shape(format!(
            "{} ground-truth entries for {} queries",
            gnd.len(),
            reranker.num_queries()
        )));
    }
    let ranks: Vec<Vec<usize>> = rankings(reranker)?
        .into_iter()
        .map(|r| r.into_iter().map(|j| j as usize).collect())
        .collect();
    protocols
        .iter()
        .map(|&p| revisited::evaluate(&ranks, gnd, p, kappas))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rerank::CosineRanking;
    use crate::retrieval::{self, EvalOptions, SelfMatch};
    use candle_core::{Device, Tensor};

    fn features() -> (Tensor, Labels) {
        let x = Tensor::new(
            &[
                [1.0f32, 0.1, 0.0],
                [0.9, 0.0, 0.2],
                [0.1, 1.0, 0.0],
                [0.0, 0.8, 0.3],
                [0.5, 0.5, 0.1],
                [0.0, 0.1, 1.0],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let y = Labels::new(vec![
            vec![0, 10],
            vec![0, 10],
            vec![1, 10],
            vec![1, 10],
            vec![2, 11],
            vec![2, 11],
        ])
        .unwrap();
        (x, y)
    }

    #[test]
    fn cosine_ranking_matches_the_exact_engine() {
        let (x, y) = features();
        let ours = evaluate(
            &CosineRanking::new(&x, None).unwrap(),
            &y,
            None,
            &RerankEvalOptions {
                per_level: true,
                ..RerankEvalOptions::default()
            },
        )
        .unwrap();
        let engine = retrieval::evaluate(
            &x,
            &y,
            None,
            &EvalOptions {
                recall_ks: vec![1, 2, 4, 8],
                self_match: SelfMatch::SameIndex,
                hierarchical: false,
                ..EvalOptions::default()
            },
        )
        .unwrap();
        for row in &ours.rows {
            let v = engine.get(&row.metric, row.level).unwrap();
            assert!(
                (v - row.value).abs() < 1e-12,
                "{}: {v} vs {}",
                row.metric,
                row.value
            );
        }
        assert_eq!(ours.num_references, 5);
    }

    #[test]
    fn revisited_and_errors() {
        let (x, y) = features();
        let q = x.narrow(0, 0, 2).unwrap();
        let r = CosineRanking::new(&q, Some(&x)).unwrap();
        let gnd = vec![
            GroundTruth {
                easy: vec![0, 1],
                hard: vec![4],
                junk: vec![],
            },
            GroundTruth {
                easy: vec![1],
                hard: vec![],
                junk: vec![0],
            },
        ];
        let reports = evaluate_revisited(&r, &gnd, &[Protocol::Medium], &[1]).unwrap();
        // Query 0 ranks 0, 1, 4 first (AP 1); query 1 ranks itself (1) first, junk 0 is skipped.
        assert!((reports[0].map - 1.0).abs() < 1e-12);
        assert!(evaluate(&r, &y, None, &RerankEvalOptions::default()).is_err());
        let ql = y.select(&[0, 1]).unwrap();
        assert!(evaluate(&r, &ql, Some(&y), &RerankEvalOptions::default()).is_ok());
        let bad = RerankEvalOptions {
            recall_ks: vec![0],
            ..RerankEvalOptions::default()
        };
        assert!(evaluate(&r, &ql, Some(&y), &bad).is_err());
        assert!(evaluate(&r, &y, Some(&y), &RerankEvalOptions::default()).is_err());
        assert!(evaluate_revisited(&r, &gnd[..1], &[Protocol::Hard], &[1]).is_err());
    }
}

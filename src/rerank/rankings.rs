//! The rankings a [`Reranker`] makes, as reference indices: every query's full list
//! ([`rankings`]), the top-N that SSR refines ([`super::TopN::from_reranker`]) and the revisited
//! Oxford/Paris mAP (Medium / Hard, SSR Table 1) computed on them ([`evaluate_revisited`]).
//! The metrics of a re-ranking (mAP@R, mAP, R@k, H-AP, …) come from the crate's one
//! evaluation engine through [`Reranker::evaluate`].
//!
//! Each query's whole reference list is ranked (decreasing score, ties by reference index, as
//! [`crate::retrieval::order`]), a chunk of queries at a time, so memory stays
//! `O(chunk × N_r)` except for [`rankings`] and [`evaluate_revisited`], which keep every full
//! ranking (`Q × N_r` indices — fine for the 70 queries of rOxford/rParis).

use super::Reranker;
use crate::error::{Error, Result};
use crate::metrics::revisited::{self, GroundTruth, Protocol, RevisitedReport};
use crate::retrieval::order::{descending_key, sort_by_key_stable, RadixScratch};
use crate::retrieval::{check_chunk_scores, for_each_chunk};
use rayon::prelude::*;

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
    let nr = reranker.num_references();
    let same = reranker.queries_are_references();
    // The engine's chunk loop (a re-ranker is a score source of its own).
    for_each_chunk(reranker, chunk_size, |start, len, chunk| {
        chunk.with_slice(|scores| {
            check_chunk_scores(scores, start, len, nr, true)?;
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
            Ok(())
        })?
    })
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
    use crate::hierarchy::Labels;
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
        let opts = EvalOptions {
            recall_ks: vec![1, 2, 4, 8],
            self_match: SelfMatch::SameIndex,
            ..EvalOptions::default()
        };
        let ours = CosineRanking::new(&x, None)
            .unwrap()
            .evaluate(&y, None, &opts)
            .unwrap();
        let engine = retrieval::evaluate(&x, &y, None, &opts).unwrap();
        assert_eq!(ours.rows.len(), engine.rows.len());
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
        let opts = EvalOptions::default();
        assert!(r.evaluate(&y, None, &opts).is_err());
        let ql = y.select(&[0, 1]).unwrap();
        assert!(r.evaluate(&ql, Some(&y), &opts).is_ok());
        let bad = EvalOptions {
            recall_ks: vec![0],
            ..EvalOptions::default()
        };
        assert!(r.evaluate(&ql, Some(&y), &bad).is_err());
        assert!(r.evaluate(&y, Some(&y), &opts).is_err());
        assert!(evaluate_revisited(&r, &gnd[..1], &[Protocol::Hard], &[1]).is_err());
    }
}

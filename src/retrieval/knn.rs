//! Exact k-nearest-neighbour search (brute force, chunked), the building block of R@k
//! evaluation, k-reciprocal re-ranking and SSR's top-N graphs.

use super::order::rank_key;
use super::{for_each_chunk, prepare, SelfMatch, Similarity};
use crate::error::{Error, Result};
use crate::progress::Progress;
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// The `k` best references of every query, best first (ties by reference index).
#[derive(Debug, Clone, PartialEq)]
pub struct Knn {
    /// Neighbours per query.
    pub k: usize,
    /// Reference indices, row-major `N_q × k`.
    pub indices: Vec<u32>,
    /// The matching scores (similarity; larger is closer), row-major `N_q × k`.
    pub scores: Vec<f32>,
}

impl Knn {
    /// Number of queries.
    pub fn num_queries(&self) -> usize {
        self.indices.len().checked_div(self.k).unwrap_or(0)
    }

    /// Neighbour indices of query `i`.
    pub fn neighbours(&self, i: usize) -> &[u32] {
        &self.indices[i * self.k..(i + 1) * self.k]
    }

    /// Neighbour scores of query `i`.
    pub fn row_scores(&self, i: usize) -> &[f32] {
        &self.scores[i * self.k..(i + 1) * self.k]
    }
}

/// Exact top-`k` cosine neighbours of every query among `references`.
///
/// `self_match` removes the query itself as in [`super::evaluate`]. Errors if `k` is 0 or larger
/// than the number of references left after that removal.
pub fn knn(
    queries: &Tensor,
    references: &Tensor,
    k: usize,
    self_match: SelfMatch,
    chunk_size: usize,
) -> Result<Knn> {
    knn_with(
        queries,
        references,
        k,
        self_match,
        chunk_size,
        Similarity::Cosine,
        &Device::Cpu,
        false,
    )
}

/// [`knn`] with the similarity, the device of the matrix products and a progress bar chosen.
#[allow(clippy::too_many_arguments)]
pub fn knn_with(
    queries: &Tensor,
    references: &Tensor,
    k: usize,
    self_match: SelfMatch,
    chunk_size: usize,
    similarity: Similarity,
    device: &Device,
    progress: bool,
) -> Result<Knn> {
    if chunk_size == 0 {
        return Err(Error::invalid("chunk_size", "must be at least 1"));
    }
    let ops = prepare(queries, references, similarity, device)?;
    let available = match self_match {
        SelfMatch::None => ops.num_references,
        _ => ops.num_references.saturating_sub(1),
    };
    if k == 0 || k > available {
        return Err(Error::invalid(
            "k",
            format!("must be between 1 and {available} (the references each query can retrieve), got {k}"),
        ));
    }
    if self_match == SelfMatch::SameIndex && ops.num_queries > ops.num_references {
        return Err(Error::invalid(
            "self_match",
            "SameIndex needs query i to be reference i, but there are more queries than references",
        ));
    }
    let nq = ops.num_queries;
    let nr = ops.num_references;
    // DropFirst selects one more and discards the best hit afterwards.
    let take = if self_match == SelfMatch::DropFirst {
        k + 1
    } else {
        k
    };
    let mut indices = vec![0u32; nq * k];
    let mut scores = vec![0f32; nq * k];
    let pb = Progress::new(nq, "queries", "kNN", progress);
    for_each_chunk(&ops, chunk_size, |start, len, chunk| {
        chunk.with_slice(|chunk| {
            indices[start * k..(start + len) * k]
                .par_chunks_mut(k)
                .zip(scores[start * k..(start + len) * k].par_chunks_mut(k))
                .zip(chunk.par_chunks(nr))
                .enumerate()
                .for_each_init(
                    || (Vec::with_capacity(nr), Vec::new()),
                    |(keys, sample): &mut (Vec<u64>, Vec<f32>),
                     (r, ((idx_out, score_out), row))| {
                        let qi = start + r;
                        let skip = (self_match == SelfMatch::SameIndex).then_some(qi);
                        // Only scores ≥ a threshold can be in the top `take`: a threshold taken from
                        // a sample lets one cheap scan discard ~95% of the row before any selection.
                        // If fewer than `take` scores pass, the full row is used, so the result is
                        // exact either way.
                        let threshold = sample_threshold(row, take, sample);
                        collect_keys(row, skip, threshold, keys);
                        if keys.len() < take {
                            collect_keys(row, skip, f32::NEG_INFINITY, keys);
                        }
                        // Partial selection: O(N) to find the k best, then sort only those.
                        if take < keys.len() {
                            keys.select_nth_unstable(take - 1);
                            keys.truncate(take);
                        }
                        keys.sort_unstable();
                        let first = take - k;
                        for (o, &key) in keys[first..].iter().enumerate() {
                            let j = (key & 0xffff_ffff) as usize;
                            idx_out[o] = j as u32;
                            score_out[o] = row[j];
                        }
                    },
                );
        })?;
        pb.inc(len as u64);
        Ok(())
    })?;
    pb.finish();
    Ok(Knn { k, indices, scores })
}

/// Packs the scores of `row` that are ≥ `threshold` (all of them for −∞), except `skip`.
fn collect_keys(row: &[f32], skip: Option<usize>, threshold: f32, keys: &mut Vec<u64>) {
    // The threshold passes ~3% of a row: a block of 16 scores is tested with one vectorised
    // comparison (a fold, not a short-circuiting `any`, so that it vectorises) and only blocks
    // holding a passing score are unpacked. Writing a key for every score and advancing the
    // cursor only for the kept ones (the branch-free compaction this replaces) cost 4× more at
    // SOP scale: half a megabyte of keys written, and cleared, per row.
    const BLOCK: usize = 16;
    keys.clear();
    for (b, block) in row.chunks(BLOCK).enumerate() {
        if !block.iter().fold(false, |any, &s| any | (s >= threshold)) {
            continue;
        }
        for (i, &s) in block.iter().enumerate() {
            if s >= threshold {
                keys.push(rank_key(s, (b * BLOCK + i) as u32));
            }
        }
    }
    if let Some(skip) = skip {
        if row[skip] >= threshold {
            let self_key = rank_key(row[skip], skip as u32);
            keys.retain(|&k| k != self_key);
        }
    }
}

/// A score that about `2 · take` entries of `row` exceed, estimated from an evenly strided
/// sample of 4096 entries; `−∞` when the row is too short for filtering to pay.
fn sample_threshold(row: &[f32], take: usize, sample: &mut Vec<f32>) -> f32 {
    const SAMPLE: usize = 4096;
    let n = row.len();
    if n < 4 * SAMPLE || 8 * take >= n {
        return f32::NEG_INFINITY;
    }
    sample.clear();
    sample.extend(row.iter().step_by(n / SAMPLE));
    let m = sample.len();
    // Expected position of the take-th best score in the sample, with a 2× margin (+16 for
    // small k), so that the fallback is rare.
    let pos = ((2 * take * m) / n + 16).min(m - 1);
    let (_, t, _) = sample.select_nth_unstable_by(pos, |a, b| b.total_cmp(a));
    *t
}

//! Exact k-nearest-neighbour search (brute force, chunked), the building block of R@k
//! evaluation, k-reciprocal re-ranking and SSR's top-N graphs. On a CUDA device the candidates
//! of each row are kept on the device and only they are copied back ([`super::device_rank`]).

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
    let same_index = self_match == SelfMatch::SameIndex;
    // On a CUDA device, the device keeps each row's candidates (the scores at or above the
    // sampled threshold) and only they come to the host (`device_rank`).
    #[cfg(feature = "cuda")]
    let selector = if filters(nr, take) {
        let stride = sample_stride(nr);
        super::device_rank::knn_plan(ops.queries.device(), nr, take, same_index, stride)?
    } else {
        None
    };
    #[cfg(feature = "cuda")]
    if let Some(selector) = selector {
        let threshold = |sample: &mut [f32]| threshold_of_sample(sample, nr, take);
        super::pipeline(
            nq,
            chunk_size,
            true,
            |start, len, chunk: &mut super::device_rank::KnnChunk| {
                selector.candidates(
                    ops.device_scores(start, len)?,
                    start,
                    len,
                    chunk,
                    &threshold,
                )
            },
            |start, len, chunk| {
                indices[start * k..(start + len) * k]
                    .par_chunks_mut(k)
                    .zip(scores[start * k..(start + len) * k].par_chunks_mut(k))
                    .enumerate()
                    .try_for_each_init(
                        || (Vec::new(), Vec::new()),
                        |(keys, sample): &mut (Vec<u64>, Vec<f32>),
                         (r, (idx_out, score_out))|
                         -> Result<()> {
                            match chunk.candidates(r).filter(|c| c.len() >= take) {
                                Some(candidates) => {
                                    keys.clear();
                                    keys.extend_from_slice(candidates);
                                    best_first(keys, take);
                                    let best = &keys[take - k..];
                                    write_row(best, idx_out, score_out, |_, key| score_of_key(key));
                                }
                                // Fewer candidates than `take`, or more than the slots: the
                                // row's scores, ranked as on the host (rare).
                                None => {
                                    let row = chunk.row_scores(r)?;
                                    let skip = same_index.then_some(start + r);
                                    top_keys(&row, skip, take, keys, sample);
                                    let best = &keys[take - k..];
                                    write_row(best, idx_out, score_out, |j, _| row[j]);
                                }
                            }
                            Ok(())
                        },
                    )?;
                pb.inc(len as u64);
                Ok(())
            },
        )?;
        pb.finish();
        return Ok(Knn { k, indices, scores });
    }
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
                        let skip = same_index.then_some(start + r);
                        top_keys(row, skip, take, keys, sample);
                        write_row(&keys[take - k..], idx_out, score_out, |j, _| row[j]);
                    },
                );
        })?;
        pb.inc(len as u64);
        Ok(())
    })?;
    pb.finish();
    Ok(Knn { k, indices, scores })
}

/// The rank keys of the `take` best references of `row` (all but `skip`), best first.
///
/// Only scores ≥ a threshold can be in the top `take`: a threshold taken from a sample lets one
/// cheap scan discard ~95% of the row before any selection. If fewer than `take` scores pass,
/// the full row is used, so the result is exact either way.
fn top_keys(
    row: &[f32],
    skip: Option<usize>,
    take: usize,
    keys: &mut Vec<u64>,
    sample: &mut Vec<f32>,
) {
    let threshold = sample_threshold(row, take, sample);
    collect_keys(row, skip, threshold, keys);
    if keys.len() < take {
        collect_keys(row, skip, f32::NEG_INFINITY, keys);
    }
    best_first(keys, take);
}

/// Writes a query's neighbours from their rank keys, best first: each key's reference index
/// and its score, `score(index, key)`.
fn write_row(
    best: &[u64],
    idx_out: &mut [u32],
    score_out: &mut [f32],
    score: impl Fn(usize, u64) -> f32,
) {
    for ((&key, i), s) in best.iter().zip(idx_out).zip(score_out) {
        // The key's low half is the reference index.
        *i = key as u32;
        *s = score(key as u32 as usize, key);
    }
}

/// Keeps the `take` smallest rank keys (the best references), in increasing order: a partial
/// selection (`O(N)` to find them), then a sort of those only.
fn best_first(keys: &mut Vec<u64>, take: usize) {
    if take < keys.len() {
        keys.select_nth_unstable(take - 1);
        keys.truncate(take);
    }
    keys.sort_unstable();
}

/// The score a rank key was made from ([`super::order::rank_key`]'s inverse; `−0.0` comes back
/// as `+0.0`, which it ties with).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn score_of_key(key: u64) -> f32 {
    let ascending = !((key >> 32) as u32);
    let bits = if ascending & 0x8000_0000 != 0 {
        ascending & 0x7fff_ffff
    } else {
        !ascending
    };
    f32::from_bits(bits)
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

/// The sample of [`sample_threshold`]: about this many entries of a row, evenly strided.
const SAMPLE: usize = 4096;

/// Whether a row of `n` scores is long enough, against `take`, for the sampled threshold to
/// pay.
fn filters(n: usize, take: usize) -> bool {
    n >= 4 * SAMPLE && 8 * take < n
}

/// The stride of [`sample_threshold`]'s sample of a row of `n` scores.
fn sample_stride(n: usize) -> usize {
    (n / SAMPLE).max(1)
}

/// A score that about `2 · take` entries of `row` exceed, estimated from an evenly strided
/// sample of 4096 entries; `−∞` when the row is too short for filtering to pay.
fn sample_threshold(row: &[f32], take: usize, sample: &mut Vec<f32>) -> f32 {
    let n = row.len();
    if !filters(n, take) {
        return f32::NEG_INFINITY;
    }
    sample.clear();
    sample.extend(row.iter().step_by(sample_stride(n)));
    threshold_of_sample(sample, n, take)
}

/// [`sample_threshold`] from the row's sample (`row[0], row[s], row[2s], …`, stride
/// [`sample_stride`]), for a row of `n` scores that [`filters`].
fn threshold_of_sample(sample: &mut [f32], n: usize, take: usize) -> f32 {
    let m = sample.len();
    // Expected position of the take-th best score in the sample, with a 2× margin (+16 for
    // small k), so that the fallback is rare.
    let pos = ((2 * take * m) / n + 16).min(m - 1);
    let (_, t, _) = sample.select_nth_unstable_by(pos, |a, b| b.total_cmp(a));
    *t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_key_gives_back_its_score() {
        for s in [
            0.0f32,
            1.0,
            -1.0,
            0.25,
            -0.75,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-42,
            -1e-42,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ] {
            assert_eq!(score_of_key(rank_key(s, 7)).to_bits(), s.to_bits(), "{s}");
        }
        // −0.0 ties +0.0 and comes back as +0.0.
        assert_eq!(score_of_key(rank_key(-0.0, 3)).to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn the_sampled_threshold_is_the_one_of_the_row_s_sample() {
        let n = 20_000;
        let row: Vec<f32> = (0..n).map(|i| ((i * 7919) % n) as f32 / n as f32).collect();
        let take = 100;
        assert!(filters(n, take) && !filters(n, n / 8) && !filters(4 * SAMPLE - 1, 1));
        let mut sample = Vec::new();
        let t = sample_threshold(&row, take, &mut sample);
        let mut strided: Vec<f32> = row.iter().step_by(sample_stride(n)).copied().collect();
        assert_eq!(threshold_of_sample(&mut strided, n, take), t);
        let passing = row.iter().filter(|&&s| s >= t).count();
        assert!(passing >= take && passing < 4 * take, "{passing}");
    }
}

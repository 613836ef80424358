//! The evaluation's ranking on a CUDA device: each query's positives placed in its full ranking
//! by kernels of our own (`device_rank.cu` beside this file), so that only their positions and
//! levels come back to the host, not the scores.
//!
//! **Why.** Every metric reads only the positions and levels of a query's positives and the
//! length of its list (`retrieval::positives`). With the scores on a GPU, the host engine copies
//! every chunk of them to the host (60,502² scores at SOP scale: 14.6 GB) and radix-sorts each
//! row on the host's cores: 7.8 s for the fine-level binary metrics on the H200 of 2026-11-26,
//! where PyTorch's `argsort` and metrics on the card took 0.51 s (12.3 s for every metric).
//! Here, for each chunk of queries, on the device:
//!
//! ```text
//! gather    thread (query, reference): its level of match; a positive's rank key (the score's
//!           descending key, then its index) and level go to one of its query's slots
//! merge     thread (query, positive), ⌈log₂ P⌉ passes: a merge sort of each query's positives
//!           by key; each finds its place in the merge of its run with the sibling run by
//!           binary search
//! count     thread (query, negative):  binary search among the sorted positives: b of them
//!           rank before it; gap[b] += 1
//! positions thread (query):            position of positive k = k + Σ_{b ≤ k} gap[b]
//! ```
//!
//! The rank key is the host's ([`super::order::rank_key`]: decreasing score, ties by increasing
//! reference index), so the positions are those of the host's full sort and, given the same
//! scores, every metric is bit-identical to the host engine's. Per query `O(N_r log P +
//! P log² P)` work for `P` positives and `O(P)` memory, no sort of the `N_r` scores, and no
//! synchronisation inside a kernel (so that the emulation can run them). A positive is an item
//! whose level of match is at least the lowest level a planned metric reads: for the fine-level
//! binary metrics, the fine class alone (SOP: 2–12 positives per query, not a super-class's few
//! thousand); the items of lower levels count as negatives, which moves no metric that does not
//! read them. The engine takes this path on CUDA, with [`enabled`], for chunks of fewer than
//! 2³¹ positives (their slots are 32-bit; 26 bytes of device memory each).
//!
//! **The top-k (kNN) too.** [`super::knn_with`] on a CUDA device keeps each query's candidates
//! on the device: the host's sampled threshold (a strided sample of each row copied to the
//! host, the same threshold as the host's kNN, about `2k` entries above it), then one thread
//! per (query, reference) puts the rank key of each score at or above it in one of the row's
//! `3k + 512` slots; only the slots come back, and the host selects and sorts them (a row with
//! fewer than `k` candidates or more than its slots is ranked from its scores, as on the host).
//!
//! **Switch.** On unless `RANKWISE_DEVICE_RANKING` is `0`, `off` or `false` (or [`set_enabled`]
//! said otherwise), and with the library's kernels ([`crate::kernels::enabled`]): otherwise the
//! scores go to the host and are ranked there, for a side-by-side measurement or as a fallback.
//! The GPU check compares both on the same device scores (exactly) and times both.
//!
//! **Tests.** The unit tests compile the kernels with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/rank.cpp`; the kernels whose threads take slots from an
//! atomic counter run in scrambled orders) and compare positions, levels and counts with the
//! host's ranking: ties, signed zeros, the query left out, rows without positives and rows of
//! positives only, every lowest level.

use super::ReferenceLevels;
use std::collections::HashMap;

static SWITCH: crate::switch::EnvSwitch = crate::switch::EnvSwitch::new("RANKWISE_DEVICE_RANKING");

/// Whether the evaluation ranks on the device when its scores are on a CUDA device (and the
/// library's kernels are [on](crate::kernels::enabled)).
pub fn enabled() -> bool {
    SWITCH.on()
}

/// Turns the device ranking on or off for the whole process (the GPU check measures both).
pub fn set_enabled(on: bool) {
    SWITCH.set(on);
}

/// The kernels' parameters (`struct rw_rank` of `device_rank.cu`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) struct Params {
    rows: u32,
    nr: u32,
    levels: u32,
    min_level: u32,
    start: u32,
    same_index: i32,
}

/// The kNN kernel's parameters (`struct rw_knn` of `device_rank.cu`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) struct KnnParams {
    rows: u32,
    nr: u32,
    cap: u32,
    start: u32,
    same_index: i32,
}

/// Each query's number of positives: references whose level of match is at least `min_level`
/// (≥ 1), reference `q` left out of query `q`'s list with `same_index`. The kernels' slots.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(super) fn positive_counts(
    query_rows: &[Vec<i64>],
    refs: &ReferenceLevels,
    min_level: u8,
    same_index: bool,
) -> Vec<u32> {
    // Level ≥ m ⇔ the m coarsest labels agree: one count per distinct m-prefix.
    let m = usize::from(min_level).min(refs.columns_coarse_first.len());
    let nr = refs.columns_coarse_first.first().map_or(0, Vec::len);
    let mut sizes: HashMap<Vec<i64>, u32> = HashMap::new();
    for j in 0..nr {
        let key: Vec<i64> = refs.columns_coarse_first[..m]
            .iter()
            .map(|c| c[j])
            .collect();
        *sizes.entry(key).or_default() += 1;
    }
    query_rows
        .iter()
        .enumerate()
        .map(|(q, row)| {
            let n = sizes.get(&row[..m]).copied().unwrap_or(0);
            let own = same_index && q < nr && refs.level(row, q) >= min_level;
            n - u32::from(own)
        })
        .collect()
}

/// Whether the kernels can take every chunk of `chunk_size` queries: each chunk's `Σ P` slots
/// below 2³¹ (the kernels' indices and merge widths are 32-bit).
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(super) fn fits(counts: &[u32], chunk_size: usize) -> bool {
    counts.chunks(chunk_size.max(1)).all(|chunk| {
        let slots: u64 = chunk.iter().map(|&p| u64::from(p)).sum();
        slots < 1 << 31
    })
}

/// The positives of one chunk's queries, ranked on the device and copied back: query `r`'s are
/// `offsets[r]..offsets[r + 1]`, positions increasing, with their levels.
#[derive(Default)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(super) struct RankedChunk {
    offsets: Vec<usize>,
    positions: Vec<u32>,
    levels: Vec<u8>,
}

#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
impl RankedChunk {
    /// Query `r`'s positions and levels.
    pub(super) fn row(&self, r: usize) -> (&[u32], &[u8]) {
        let range = self.offsets[r]..self.offsets[r + 1];
        (&self.positions[range.clone()], &self.levels[range])
    }

    /// Takes the kernels' output for queries whose slots start at `offsets` ([`offsets`]).
    fn set(&mut self, offsets: &[u32], positions: Vec<u32>, levels: Vec<u8>) {
        self.offsets.clear();
        self.offsets.extend(offsets.iter().map(|&o| o as usize));
        self.positions = positions;
        self.levels = levels;
    }
}

/// The kernels' slot offsets of queries with `counts` positives each: `counts.len() + 1`
/// prefix sums, the last one the chunk's number of slots (which [`fits`] keeps below 2³¹).
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn offsets(counts: &[u32]) -> Vec<u32> {
    let mut acc = 0u32;
    std::iter::once(0)
        .chain(counts.iter().map(|&p| {
            acc += p;
            acc
        }))
        .collect()
}

/// The candidates of one chunk's queries for the kNN, kept on the device and copied back: row
/// `r`'s first `min(fill[r], cap)` slots of `keys[r · cap..]`, in no order; the chunk's scores
/// stay on the device for the rows whose candidates do not suffice.
#[derive(Default)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(super) struct KnnChunk {
    fill: Vec<u32>,
    keys: Vec<u64>,
    cap: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    scores: Option<candle_core::Tensor>,
}

#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
impl KnnChunk {
    /// Row `r`'s candidates, `None` when more passed than its slots hold.
    pub(super) fn candidates(&self, r: usize) -> Option<&[u64]> {
        let fill = self.fill[r] as usize;
        (fill <= self.cap).then(|| &self.keys[r * self.cap..r * self.cap + fill])
    }

    /// Row `r`'s scores, copied from the device.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn row_scores(&self, r: usize) -> crate::error::Result<Vec<f32>> {
        let scores = self.scores.as_ref().ok_or_else(|| {
            crate::error::Error::invalid("kNN", "a candidate chunk without its scores")
        })?;
        Ok(scores.narrow(0, r, 1)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Slots per row for `take` neighbours: the sampled threshold passes about `2 · take` scores
/// (plus 16 strides of the sample), so `3 · take + 512` leaves a margin of several standard
/// deviations.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn knn_slots(take: usize) -> usize {
    3 * take + 512
}

#[cfg(feature = "cuda")]
pub(super) use cuda::{knn_plan, plan};

#[cfg(feature = "cuda")]
mod cuda {
    use super::{fits, knn_slots, offsets, positive_counts, KnnChunk, Params, RankedChunk};
    use super::{KnnParams, ReferenceLevels};
    use crate::error::{Error, Result};
    use crate::kernels::{check_matrix, per_entry, per_row, ptx, view};
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{DType, Device, Storage, Tensor};

    const SOURCE: &str = include_str!("device_rank.cu");
    const MODULE: &str = "rankwise_rank";
    const OP: &str = "device ranking";

    // SAFETY: `Params` is `repr(C)` plain data with the layout of `struct rw_rank`.
    unsafe impl DeviceRepr for Params {}
    // SAFETY: `KnnParams` is `repr(C)` plain data with the layout of `struct rw_knn`.
    unsafe impl DeviceRepr for KnnParams {}

    /// Launches of one thread per `(row, column)` have `⌈columns / 256⌉` blocks along y, at most
    /// 65,535.
    const MAX_COLUMNS: usize = 65_535 * 256;

    /// One evaluation's labels on the device, each query's number of positives and the
    /// kernels' fixed parameters.
    pub(in crate::retrieval) struct Plan {
        dev: CudaDevice,
        /// The references' label columns, coarsest first (`levels × N_r`).
        refs: CudaSlice<i64>,
        /// The queries' labels, coarsest first (`N_q × levels`).
        queries: CudaSlice<i64>,
        counts: Vec<u32>,
        params: Params,
    }

    /// The device ranking's plan for an evaluation whose scores are on `device`, or `None` where
    /// the host ranks: not a CUDA device, the switches off, sizes beyond the kernels' (more than
    /// 255 label levels, `N_r` beyond the launch grid, a chunk of 2³¹ positives or more).
    pub(in crate::retrieval) fn plan(
        device: &Device,
        refs: &ReferenceLevels,
        query_rows: &[Vec<i64>],
        min_level: u8,
        same_index: bool,
        chunk_size: usize,
    ) -> Result<Option<Plan>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let levels = refs.columns_coarse_first.len();
        let nr = refs.columns_coarse_first.first().map_or(0, Vec::len);
        if !(super::enabled() && crate::kernels::enabled())
            || levels == 0
            || levels > usize::from(u8::MAX)
            || min_level == 0
            || nr == 0
            || query_rows.is_empty()
            || nr > MAX_COLUMNS
            || query_rows.len() > u32::MAX as usize
        {
            return Ok(None);
        }
        let counts = positive_counts(query_rows, refs, min_level, same_index);
        if !fits(&counts, chunk_size) {
            return Ok(None);
        }
        let flat_refs: Vec<i64> = refs.columns_coarse_first.concat();
        let flat_queries: Vec<i64> = query_rows.concat();
        Ok(Some(Plan {
            refs: dev.clone_htod(&flat_refs)?,
            queries: dev.clone_htod(&flat_queries)?,
            dev: dev.clone(),
            counts,
            params: Params {
                rows: 0,
                nr: nr as u32,
                levels: levels as u32,
                min_level: u32::from(min_level),
                start: 0,
                same_index: i32::from(same_index),
            },
        }))
    }

    impl Plan {
        /// Ranks the positives of queries `start..start + len` from their scores (`len × N_r`,
        /// `f32`, on this plan's device) into `out`.
        pub(in crate::retrieval) fn rank(
            &self,
            scores: &Tensor,
            start: usize,
            len: usize,
            out: &mut RankedChunk,
        ) -> Result<()> {
            let counts = &self.counts[start..start + len];
            let offsets = offsets(counts);
            let total = offsets[len] as usize;
            if total == 0 {
                out.set(&offsets, Vec::new(), Vec::new());
                return Ok(());
            }
            let widest = counts.iter().copied().max().unwrap_or(0) as usize;
            let scores = scores.to_dtype(DType::F32)?.contiguous()?;
            let (storage, layout) = scores.storage_and_layout();
            let Storage::Cuda(cs) = &*storage else {
                return Err(Error::invalid(
                    "device",
                    "the device ranking's scores are not on a CUDA device",
                ));
            };
            let nr = self.params.nr as usize;
            check_matrix(OP, layout, len, nr)?;
            let s = view::<f32>(cs, layout)?;
            let l = self.params.levels as usize;
            let queries = self.queries.slice(start * l..(start + len) * l);
            let p = Params {
                rows: len as u32,
                start: start as u32,
                ..self.params
            };
            let dev = &self.dev;
            let offsets_d = dev.clone_htod(&offsets)?;
            let mut fill = dev.alloc_zeros::<u32>(len)?;
            let mut keys = dev.alloc_zeros::<u64>(total)?;
            let mut levels = dev.alloc_zeros::<u8>(total)?;
            let mut sorted = dev.alloc_zeros::<u64>(total)?;
            let mut sorted_levels = dev.alloc_zeros::<u8>(total)?;
            let mut gaps = dev.alloc_zeros::<u32>(total)?;
            let mut positions = dev.alloc_zeros::<u32>(total)?;
            let module = ptx(MODULE, SOURCE)?;
            let func = |name: &str| dev.get_or_load_custom_func(name, MODULE, module);

            let gather = func("rankwise_rank_gather")?;
            let mut b = gather.builder();
            b.arg(&s)
                .arg(&self.refs)
                .arg(&queries)
                .arg(&offsets_d)
                .arg(&p)
                .arg(&mut fill)
                .arg(&mut keys)
                .arg(&mut levels);
            // SAFETY: `s` holds `len × N_r` scores, `refs` `levels × N_r` labels, `queries`
            // `len × levels`, `offsets_d` `len + 1` offsets ending at `total`, `fill` `len`
            // counters; `keys` and `levels` `total` slots, written only below each row's end.
            unsafe { b.launch(per_entry(len, nr)) }.w()?;

            // The merge passes, from runs of 1 to one run as wide as the widest row, between
            // the two pairs of buffers in turn; `in_first`: the keys are in the first pair.
            let merge = func("rankwise_rank_merge")?;
            let mut width = 1u32;
            let mut in_first = true;
            while (width as usize) < widest {
                let mut b = merge.builder();
                b.arg(&offsets_d).arg(&p).arg(&width);
                if in_first {
                    b.arg(&keys)
                        .arg(&levels)
                        .arg(&mut sorted)
                        .arg(&mut sorted_levels);
                } else {
                    b.arg(&sorted)
                        .arg(&sorted_levels)
                        .arg(&mut keys)
                        .arg(&mut levels);
                }
                // SAFETY: each row's threads read and write within its `offsets` range of
                // `total`, from one pair of buffers into the other.
                unsafe { b.launch(per_entry(len, widest)) }.w()?;
                in_first = !in_first;
                width *= 2;
            }
            let (sorted_keys, sorted_levels) = if in_first {
                (&keys, &levels)
            } else {
                (&sorted, &sorted_levels)
            };

            let count = func("rankwise_rank_count")?;
            let mut b = count.builder();
            b.arg(&s)
                .arg(&self.refs)
                .arg(&queries)
                .arg(&offsets_d)
                .arg(&p)
                .arg(sorted_keys)
                .arg(&mut gaps);
            // SAFETY: as the gather; `gaps` has `total` counters, indexed within each row's range.
            unsafe { b.launch(per_entry(len, nr)) }.w()?;

            let place = func("rankwise_rank_positions")?;
            let mut b = place.builder();
            b.arg(&offsets_d).arg(&p).arg(&gaps).arg(&mut positions);
            // SAFETY: one thread per row, within its range of `total`.
            unsafe { b.launch(per_row(len)) }.w()?;

            let filled = dev.clone_dtoh(&fill)?;
            if let Some(r) = (0..len).find(|&r| filled[r] != counts[r]) {
                return Err(Error::invalid(
                    "device ranking",
                    format!(
                        "query {}: {} positives found on the device, {} counted from the labels",
                        start + r,
                        filled[r],
                        counts[r]
                    ),
                ));
            }
            out.set(
                &offsets,
                dev.clone_dtoh(&positions)?,
                dev.clone_dtoh(sorted_levels)?,
            );
            Ok(())
        }
    }

    /// The kNN's candidate selection on `device` for `take` neighbours among `nr` references,
    /// each row's threshold taken from its entries `0, stride, 2 stride, …`, or `None` where the
    /// host selects: not a CUDA device, the switches off, sizes beyond the launch grid. (The
    /// caller asks only for rows long enough for a sampled threshold to pay.)
    pub(in crate::retrieval) fn knn_plan(
        device: &Device,
        nr: usize,
        take: usize,
        same_index: bool,
        stride: usize,
    ) -> Result<Option<KnnSelector>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let cap = knn_slots(take);
        if !(super::enabled() && crate::kernels::enabled())
            || nr > MAX_COLUMNS
            || cap > u32::MAX as usize
            || stride == 0
        {
            return Ok(None);
        }
        let columns: Vec<u32> = (0..nr).step_by(stride).map(|j| j as u32).collect();
        let m = columns.len();
        Ok(Some(KnnSelector {
            columns: Tensor::from_vec(columns, m, device)?,
            dev: dev.clone(),
            nr,
            cap,
            same_index,
        }))
    }

    /// What [`knn_plan`] prepared: the sample's columns on the device, the sizes.
    pub(in crate::retrieval) struct KnnSelector {
        dev: CudaDevice,
        columns: Tensor,
        nr: usize,
        cap: usize,
        same_index: bool,
    }

    impl KnnSelector {
        /// The candidates of queries `start..start + len` from their scores (`len × N_r`, on
        /// this selector's device) into `out`; `threshold` makes a row's threshold from its
        /// sample (reordering it).
        pub(in crate::retrieval) fn candidates(
            &self,
            scores: Tensor,
            start: usize,
            len: usize,
            out: &mut KnnChunk,
            threshold: &(dyn Fn(&mut [f32]) -> f32 + Sync),
        ) -> Result<()> {
            use rayon::prelude::*;
            let scores = scores.to_dtype(DType::F32)?.contiguous()?;
            // The thresholds: each row's strided sample, on the host, as the host's kNN takes it.
            let mut sample = scores
                .index_select(&self.columns, 1)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let m = self.columns.elem_count();
            let thresholds: Vec<f32> = sample.par_chunks_mut(m).map(threshold).collect();
            let dev = &self.dev;
            let thresholds_d = dev.clone_htod(&thresholds)?;
            let mut fill = dev.alloc_zeros::<u32>(len)?;
            let mut keys = dev.alloc_zeros::<u64>(len * self.cap)?;
            {
                let (storage, layout) = scores.storage_and_layout();
                let Storage::Cuda(cs) = &*storage else {
                    return Err(Error::invalid(
                        "device",
                        "the kNN's scores are not on a CUDA device",
                    ));
                };
                check_matrix(OP, layout, len, self.nr)?;
                let s = view::<f32>(cs, layout)?;
                let p = KnnParams {
                    rows: len as u32,
                    nr: self.nr as u32,
                    cap: self.cap as u32,
                    start: start as u32,
                    same_index: i32::from(self.same_index),
                };
                let module = ptx(MODULE, SOURCE)?;
                let gather = dev.get_or_load_custom_func("rankwise_knn_gather", MODULE, module)?;
                let mut b = gather.builder();
                b.arg(&s)
                    .arg(&thresholds_d)
                    .arg(&p)
                    .arg(&mut fill)
                    .arg(&mut keys);
                // SAFETY: `s` holds `len × N_r` scores, `thresholds_d` and `fill` `len` values,
                // `keys` `len × cap` slots, written only below each row's `cap`.
                unsafe { b.launch(per_entry(len, self.nr)) }.w()?;
            }
            out.fill = dev.clone_dtoh(&fill)?;
            out.keys = dev.clone_dtoh(&keys)?;
            out.cap = self.cap;
            out.scores = Some(scores);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::positives::{rank_row, PositivesScratch};
    use super::*;
    use crate::hierarchy::Labels;

    /// A chunk ranked by the kernels of `device_rank.cu`, run on the host by the harness
    /// (blocks of 3 threads; `seed` scrambles the atomic counters' threads, 0 keeps them in
    /// order): each row's fill count, and the chunk.
    #[allow(clippy::too_many_arguments)]
    fn emulate(
        scores: &[f32],
        refs: &ReferenceLevels,
        query_rows: &[Vec<i64>],
        start: usize,
        min_level: u8,
        same_index: bool,
        seed: u32,
    ) -> (Vec<u32>, RankedChunk) {
        let rows = query_rows.len() - start;
        let all = positive_counts(query_rows, refs, min_level, same_index);
        let counts = &all[start..];
        let levels = refs.columns_coarse_first.len();
        let nr = refs.columns_coarse_first[0].len();
        assert_eq!(scores.len(), rows * nr);
        let mut input = Vec::new();
        for v in [
            rows as u32,
            nr as u32,
            levels as u32,
            u32::from(min_level),
            start as u32,
            u32::from(same_index),
            seed,
        ] {
            input.extend(v.to_le_bytes());
        }
        for s in scores {
            input.extend(s.to_le_bytes());
        }
        for c in &refs.columns_coarse_first {
            for v in c {
                input.extend(v.to_le_bytes());
            }
        }
        for row in &query_rows[start..] {
            for v in row {
                input.extend(v.to_le_bytes());
            }
        }
        let offsets = offsets(counts);
        for o in &offsets {
            input.extend(o.to_le_bytes());
        }
        let out = crate::kernels::emulation::run("rank", &input);
        let total = offsets[rows] as usize;
        assert_eq!(out.len(), rows + 2 * total);
        let fill: Vec<u32> = out[..rows].iter().map(|&v| v as u32).collect();
        let positions = out[rows..rows + total].iter().map(|&v| v as u32).collect();
        let levels = out[rows + total..].iter().map(|&v| v as u8).collect();
        let mut chunk = RankedChunk::default();
        chunk.set(&offsets, positions, levels);
        (fill, chunk)
    }

    /// The host engine's ranking of each row, read at levels ≥ `min_level` (lower levels as
    /// negatives), against the kernels'.
    fn check(labels: &Labels, scores: &[f32], start: usize, min_level: u8, seed: u32) {
        let refs = ReferenceLevels::new(labels);
        let query_rows: Vec<Vec<i64>> = (0..labels.len())
            .map(|i| labels.row(i).iter().rev().copied().collect())
            .collect();
        let nr = labels.len();
        let num_levels = labels.num_levels();
        for same_index in [false, true] {
            let (fill, chunk) = emulate(
                scores,
                &refs,
                &query_rows,
                start,
                min_level,
                same_index,
                seed,
            );
            let counts = positive_counts(&query_rows, &refs, min_level, same_index);
            for (r, row) in scores.chunks(nr).enumerate() {
                let q = start + r;
                let what = format!("query {q}, lowest level {min_level}, same index {same_index}");
                assert_eq!(fill[r], counts[q], "{what}: fill");
                let level = |j: usize| {
                    let l = refs.level(&query_rows[q], j);
                    if l >= min_level {
                        l
                    } else {
                        0
                    }
                };
                let skip = same_index.then_some(q);
                for drop_first in [false, true] {
                    let mut want = PositivesScratch::default();
                    rank_row(row, level, num_levels, skip, drop_first, &mut want);
                    let (positions, levels) = chunk.row(r);
                    let mut got = PositivesScratch::default();
                    let len = nr - usize::from(same_index);
                    got.set_ranked(positions, levels, len, num_levels, drop_first);
                    let (g, w) = (got.ranked(), want.ranked());
                    assert_eq!(g.positions, w.positions, "{what}, drop {drop_first}");
                    assert_eq!(g.levels, w.levels, "{what}, drop {drop_first}");
                    assert_eq!(g.len, w.len, "{what}, drop {drop_first}");
                    assert_eq!(got.counts(), want.counts(), "{what}, drop {drop_first}");
                }
            }
        }
    }

    fn lcg(state: &mut u64) -> u32 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*state >> 33) as u32
    }

    #[test]
    fn the_kernels_place_the_positives_where_the_host_sort_does() {
        // Three label levels (fine, middle, coarse) over 70 references; scores on a coarse grid
        // (many exact ties, -0.0 beside 0.0), a chunk of queries starting at 5.
        let n = 70;
        let labels = Labels::new(
            (0..n as i64)
                .map(|i| vec![i / 4, 100 + i / 12, 200 + i / 36])
                .collect(),
        )
        .unwrap();
        let mut state = 99u64;
        let start = 5;
        let scores: Vec<f32> = (0..(n - start) * n)
            .map(|_| match lcg(&mut state) % 9 {
                0 => -0.0,
                1 => 0.0,
                _ => (lcg(&mut state) % 13) as f32 / 6.0 - 1.0,
            })
            .collect();
        for min_level in 1..=3 {
            for seed in [0, 7, 1234] {
                check(&labels, &scores, start, min_level, seed);
            }
        }
    }

    #[test]
    fn rows_without_positives_rows_of_positives_only_and_distinct_scores() {
        // One class for the first 6 references (a query among them has only positives but
        // itself), lone classes for the rest (no positive); continuous scores.
        let n = 11;
        let labels = Labels::new(
            (0..n as i64)
                .map(|i| {
                    let c = if i < 6 { 0 } else { i };
                    vec![c, 1000 + c]
                })
                .collect(),
        )
        .unwrap();
        let mut state = 3u64;
        let scores: Vec<f32> = (0..n * n)
            .map(|_| lcg(&mut state) as f32 / u32::MAX as f32 - 0.5)
            .collect();
        for min_level in 1..=2 {
            check(&labels, &scores, 0, min_level, 0);
            check(&labels, &scores, 0, min_level, 5);
        }
    }

    /// The kNN kernel run on the host by the harness: each row's fill and its slots.
    fn emulate_knn(
        scores: &[f32],
        thresholds: &[f32],
        nr: usize,
        cap: usize,
        start: usize,
        same_index: bool,
        seed: u32,
    ) -> (Vec<u32>, Vec<u64>) {
        let rows = thresholds.len();
        let mut input = Vec::new();
        for v in [
            rows as u32,
            nr as u32,
            cap as u32,
            start as u32,
            u32::from(same_index),
            seed,
        ] {
            input.extend(v.to_le_bytes());
        }
        for v in scores.iter().chain(thresholds) {
            input.extend(v.to_le_bytes());
        }
        let out = crate::kernels::emulation::run("knn", &input);
        assert_eq!(out.len(), rows + 2 * rows * cap);
        let fill = out[..rows].iter().map(|&v| v as u32).collect();
        let keys = out[rows..]
            .chunks(2)
            .map(|h| ((h[0] as u64) << 32) | h[1] as u64)
            .collect();
        (fill, keys)
    }

    #[test]
    fn the_knn_kernel_keeps_the_scores_at_or_above_the_threshold() {
        // Scores on a grid with ties and signed zeros; thresholds that pass none, some (on a
        // tie), all, and more than the slots; the query itself left out or not.
        let (rows, nr, start) = (5, 40, 3);
        let mut state = 11u64;
        let scores: Vec<f32> = (0..rows * nr)
            .map(|_| match lcg(&mut state) % 8 {
                0 => -0.0,
                _ => (lcg(&mut state) % 9) as f32 / 4.0 - 1.0,
            })
            .collect();
        let thresholds = [2.0f32, 0.5, 0.0, f32::NEG_INFINITY, -0.5];
        for cap in [8, 40] {
            for same_index in [false, true] {
                for seed in [0, 3] {
                    let (fill, keys) =
                        emulate_knn(&scores, &thresholds, nr, cap, start, same_index, seed);
                    for r in 0..rows {
                        let row = &scores[r * nr..(r + 1) * nr];
                        let mut want: Vec<u64> = (0..nr)
                            .filter(|&j| !(same_index && j == start + r))
                            .filter(|&j| row[j] >= thresholds[r])
                            .map(|j| super::super::order::rank_key(row[j], j as u32))
                            .collect();
                        want.sort_unstable();
                        let what = format!("row {r}, cap {cap}, same index {same_index}");
                        assert_eq!(fill[r] as usize, want.len(), "{what}");
                        let chunk = KnnChunk {
                            fill: fill.clone(),
                            keys: keys.clone(),
                            cap,
                            scores: None,
                        };
                        match chunk.candidates(r) {
                            Some(got) => {
                                let mut got = got.to_vec();
                                got.sort_unstable();
                                assert_eq!(got, want, "{what}");
                            }
                            None => assert!(want.len() > cap, "{what}"),
                        }
                    }
                }
            }
        }
        // One row passes all 40 (cap 8 overflows), one none.
        let (fill, _) = emulate_knn(&scores, &thresholds, nr, 8, start, false, 0);
        assert_eq!((fill[0], fill[3]), (0, 40));
        assert_eq!(knn_slots(1000), 3512);
        assert_eq!(std::mem::size_of::<KnnParams>(), 20);
    }

    #[test]
    fn counts_and_the_work_bound() {
        let labels = Labels::new(vec![vec![0, 10], vec![0, 10], vec![1, 10], vec![2, 11]]).unwrap();
        let refs = ReferenceLevels::new(&labels);
        let rows: Vec<Vec<i64>> = (0..4)
            .map(|i| labels.row(i).iter().rev().copied().collect())
            .collect();
        assert_eq!(positive_counts(&rows, &refs, 1, false), [3, 3, 3, 1]);
        assert_eq!(positive_counts(&rows, &refs, 1, true), [2, 2, 2, 0]);
        assert_eq!(positive_counts(&rows, &refs, 2, true), [1, 1, 0, 0]);
        // Σ P per chunk below 2³¹.
        assert!(fits(&[2, 2, 2, 0], 2));
        let half = 1u32 << 30;
        assert!(fits(&[half - 1, half], 2));
        assert!(!fits(&[half, half], 2));
        assert!(fits(&[half, half], 1));
        assert_eq!(std::mem::size_of::<Params>(), 24);
    }
}

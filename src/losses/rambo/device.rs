//! RaMBO on a CUDA device: ranks, loss terms and the blackbox gradient by kernels of its own,
//! with no host pass.
//!
//! The row engine of [`super::Rambo`] ranks each query's sequence on the host: on a GPU the
//! `B × B` similarities travel to the host and the gradient back, which left RaMBO at 2.2×
//! PyTorch's formulation at B = 256 on the H200 (2026-11-26), under the 3× target, and at 4.2 s
//! against PyTorch's 0.33 s at B = 16,384. Here the kernels of `device.cu` beside this file
//! compute, for each query `q` and item `j` of the shifted sequence `y = s − α(y* − ½)` (Eq. 14):
//!
//! ```text
//! rk_j  = 1 + |{k : y_k ahead of y_j}|,  rk⁺_j = 1 + |{relevant k ahead}|
//!         (ahead: larger, or equal and earlier — the host's tie rule)
//! term_j = w_q · Prec(j) = w_q rk⁺_j / rk_j          (AP, Eq. 21)
//!        = w_q · ℓ((rk_j − rk⁺_j) · c)               (recall, Eq. 20)
//! z_k   = y_k + λ g_k, g_k = ∂L/∂rk_k of the relevant k (in the ranks' units, times the
//!         incoming gradient) from rk_k, rk⁺_k, else 0
//! ∂L/∂y_j = −(rk_j − rk_j(z)) / λ                     (Algorithm 1)
//! loss = 1 − Σ term (AP) or Σ term (recall)
//! ```
//!
//! with `w_q` the query's normaliser (`1/(Q (P_q + ε))` per query, `1/P_total` pooled), which
//! depends on the labels only (and on the stored sequences' counts) and is computed on the
//! host.
//!
//! **The counts come from sorted rows**, not from a scan of each sequence per item (the first
//! version of these kernels: `2 B³` comparisons, 8.8 · 10¹² at B = 16,384, so it stopped at
//! B = 4096). Each
//! query's row is sorted with its relevant items first, then the irrelevant ones (then the
//! query's own entry when it is not in its sequence), each group in ranking order; `rk⁺_j` is
//! then one plus a binary search in the relevant group, `rk_j` that plus one in the irrelevant
//! group. In the blackbox re-ranking only the relevant entries move (`g = 0` elsewhere): the
//! irrelevant entries ahead of `z_j` are a binary search in the same sorted irrelevant group,
//! and the relevant ones a binary search in the relevant group sorted again by `z`. The counts
//! are the integers the scan counted, so every output is the same, bit for bit. The sort is a
//! merge sort made of independent threads (no shared memory, no synchronisation inside a
//! launch, so the emulation runs exactly what the device runs): runs of `TILE` (32) entries
//! sorted by counting within the run, then one launch per doubling of the runs, each entry
//! placed by a binary search in the run it merges with (every key is distinct: the column
//! breaks ties).
//!
//! Launches: the forward pass shifts and sorts the runs, merges `⌈log₂(B / TILE)⌉` times,
//! ranks, sums each query's terms (one thread per query, in column order) and the loss (one
//! thread, the queries in order, plus the stored sequences' share, cast to the input's dtype):
//! one candle op (`kernels::loss_op`). The ranks, the shifted sequences and their sorted rows
//! stay on the device for the backward pass, which perturbs the sequences with the incoming
//! gradient read there (the blackbox gradient is not linear in it: the perturbation is `λ`
//! times it), so the loss keeps its exact host semantics inside any weighted sum, sorts the
//! perturbed relevant groups and re-ranks. The work is `O(B² log² B)` (`work`), used up to
//! [`crate::kernels::max_work`] (B = 16,384 at the default); beyond, the row engine.
//!
//! Nothing the kernels need from the host depends on the data, so no step waits for the device:
//! - the **half-normal margin** ([`super::MarginMode::HalfNormal`]): its magnitudes are the
//!   host's ChaCha8 streams (one per sequence, drawn in parallel, placed at their columns), sent
//!   to the device with the step, so both engines shift by the same draws;
//! - the **score memory** ([`super::Rambo::forward_with_memory`]): the stored sequences are on
//!   the host and receive no gradient; their terms (evaluated there, as the row engine does)
//!   add a constant to the value and their counts enter the normalisers and the code's
//!   `NumSequences` count. The batch's own sequences are read back after the kernels are
//!   queued, for the caller to store.
//!
//! **Tests.** The unit tests compile `device.cu` with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/rambo.cpp`) and compare the value and the embeddings'
//! gradient with the row engine for every objective, units, averaging, count, `include_self`,
//! the half-normal margin and a score memory, with exact ties and a scaled incoming gradient,
//! for runs of 1, 4 and `TILE` entries, and with an empty group (one class; singletons with a
//! score memory); on a batch with large relevant groups and many ties, every run length gives
//! the same bits. The GPU check compares every RaMBO option on CUDA with the CPU (one of them
//! on four large classes, whose perturbed groups take merge passes).

use super::{
    normaliser, Rambo, RamboGlobal, RamboObjective, RamboRows, RecallCount, RecallWeight,
    ScoreMemory, ScoreRows,
};
use crate::error::Result;
use crate::hierarchy::Labels;
use crate::losses::blackbox_rank::RankUnits;
use crate::losses::{dense_fine_ids, l2_normalize};
use candle_core::{DType, Tensor};
use rayon::prelude::*;

/// The entries of a run sorted by counting before the merge passes: each entry scans its run,
/// so a larger run costs more per entry and saves merge launches (`⌈log₂(B / TILE)⌉` of them).
pub(crate) const TILE: u32 = 32;

/// The kernels' work for a batch of `b`, a bound on the comparisons of a forward and backward
/// pass: `b² (TILE + ⌈log₂ b⌉²)` — each entry scans its run, then takes one binary search
/// (`≤ ⌈log₂ b⌉` steps) per merge pass and a few in the ranking; `None` on overflow.
pub(crate) fn work(b: usize) -> Option<usize> {
    let log = (usize::BITS - b.saturating_sub(1).leading_zeros()) as usize;
    b.checked_mul(b)?.checked_mul(TILE as usize + log * log)
}

/// Whether `loss` on `embeddings` runs on the device: [`crate::kernels::on_cuda`], no query
/// chunk asked, and [`work`] at most [`crate::kernels::max_work`].
pub(super) fn applies(loss: &Rambo, embeddings: &Tensor) -> bool {
    let Ok(b) = embeddings.dim(0) else {
        return false;
    };
    loss.query_chunk.is_none()
        && work(b).is_some_and(|w| w <= crate::kernels::max_work())
        && crate::kernels::on_cuda(embeddings)
}

/// The kernels' parameters (`struct rw_rambo` of `device.cu`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Params {
    b: u32,
    include_self: i32,
    margin: f64,
    objective: i32,
    normalised: i32,
    lambda: f64,
    count_scale: f64,
    half_normal: i32,
    tile: u32,
}

/// The parameters of `loss` for a batch of `b` among `num_sequences` sequences (the batch's and
/// the memory's).
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn params(loss: &Rambo, b: usize, num_sequences: usize, half_normal: bool) -> Params {
    let n = if loss.include_self { b } else { b - 1 };
    Params {
        b: b as u32,
        include_self: i32::from(loss.include_self),
        margin: loss.margin,
        objective: match loss.objective {
            RamboObjective::Ap => 0,
            RamboObjective::Recall(RecallWeight::Log) => 1,
            RamboObjective::Recall(RecallWeight::LogLog) => 2,
        },
        normalised: i32::from(loss.units == RankUnits::Normalised),
        lambda: loss.lambda,
        count_scale: match loss.recall_count {
            RecallCount::Exact => 1.0,
            RecallCount::NumSequences => num_sequences as f64 / n as f64,
        },
        half_normal: i32::from(half_normal),
        tile: TILE,
    }
}

/// What the kernels take from the host for one forward pass: none of it from the data.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
struct Batch {
    params: Params,
    /// Dense fine classes.
    ids: Vec<u32>,
    /// Each query's normaliser `w_q` (0 without a relevant item).
    norms: Vec<f64>,
    /// Each query's number of relevant items in its sequence.
    rel: Vec<u32>,
    /// The half-normal magnitudes, `B × B` at their columns (0 at a query's own entry when
    /// it is not in its sequence); `None` for the deterministic margin.
    mags: Option<Vec<f64>>,
    /// Σ over the stored sequences of term × normaliser (no gradient).
    memory_value: f64,
}

impl Batch {
    fn new(rows: &RamboRows, labels: &Labels) -> Result<Batch> {
        let loss = &rows.cfg;
        let ids = dense_fine_ids(labels);
        let (norms, rel, memory_value) = normalisers(loss, &ids, &rows.memory_terms)?;
        let mags = magnitudes(rows, ids.len());
        Ok(Batch {
            params: params(loss, ids.len(), rows.num_sequences, mags.is_some()),
            ids,
            norms,
            rel,
            mags,
            memory_value,
        })
    }
}

/// Each query's normaliser `w_q` (0 without a relevant item) and number of relevant items, from
/// the labels and the stored sequences' `(term, relevant items)`, and the stored sequences'
/// share of the value; the row engine's error when no sequence has a relevant item.
fn normalisers(
    loss: &Rambo,
    ids: &[u32],
    memory_terms: &[Option<(f64, usize)>],
) -> Result<(Vec<f64>, Vec<u32>, f64)> {
    let mut sizes = std::collections::HashMap::new();
    for c in ids {
        *sizes.entry(*c).or_insert(0usize) += 1;
    }
    // Relevant items of a sequence: the query's class, minus the query unless it is kept.
    let num_pos: Vec<usize> = ids
        .iter()
        .map(|c| sizes[c] - usize::from(!loss.include_self))
        .collect();
    let global = RamboGlobal::counting(num_pos.iter().copied().filter(|&p| p > 0), memory_terms)?;
    let norms = num_pos
        .iter()
        .map(|&p| {
            if p == 0 {
                0.0
            } else {
                normaliser(loss, p, &global)
            }
        })
        .collect();
    let memory_value = memory_terms
        .iter()
        .flatten()
        .map(|&(term, p)| term * normaliser(loss, p, &global))
        .sum();
    let rel = num_pos.iter().map(|&p| p as u32).collect();
    Ok((norms, rel, memory_value))
}

/// The half-normal magnitudes of the batch's `b` sequences (the row engine's draws: stream `q`
/// of the pass), each at its column; `None` for the deterministic margin.
fn magnitudes(rows: &RamboRows, b: usize) -> Option<Vec<f64>> {
    rows.draw_seed?;
    let include_self = rows.cfg.include_self;
    let n = if include_self { b } else { b - 1 };
    let mut out = vec![0.0; b * b];
    out.par_chunks_mut(b).enumerate().for_each(|(q, row)| {
        let cols = (0..b).filter(|&j| include_self || j != q);
        for (j, m) in cols.zip(rows.magnitudes(q, n).into_iter().flatten()) {
            row[j] = m;
        }
    });
    Some(out)
}

/// The batch's sequences as the score memory stores them (raw scores, relevance), read back
/// from the device.
fn sequences(rows: &RamboRows, s: &Tensor) -> Result<ScoreRows> {
    let b = s.dim(0)?;
    let flat: Vec<f64> = s.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
    let (scores, relevant) = flat
        .chunks(b)
        .enumerate()
        .map(|(q, row)| {
            let (scores, relevant, _) = rows.sequence(q, row);
            (scores, relevant)
        })
        .unzip();
    Ok(ScoreRows { scores, relevant })
}

/// RaMBO on the device (see the module documentation), with the stored sequences of `memory`;
/// the batch's sequences for the memory when `keep`, else none.
pub(super) fn forward(
    loss: &Rambo,
    embeddings: &Tensor,
    labels: &Labels,
    memory: &ScoreMemory,
    keep: bool,
) -> Result<(Tensor, ScoreRows)> {
    crate::losses::check_batch(embeddings, labels)?;
    // Validates, counts the pass as the row engine does (a checkpoint's loss state does not
    // depend on the device) and evaluates the stored sequences.
    let rows = loss.rows(labels, memory, keep)?;
    let batch = Batch::new(&rows, labels)?;
    let e = l2_normalize(embeddings, "embeddings")?;
    let s = e.matmul(&e.t()?)?;
    let value = run(&s, batch)?;
    let kept = if keep {
        sequences(&rows, &s)?
    } else {
        ScoreRows::default()
    };
    Ok((value, kept))
}

#[cfg(feature = "cuda")]
fn run(s: &Tensor, batch: Batch) -> Result<Tensor> {
    let op = cuda::RamboOp {
        params: batch.params,
        ids: batch.ids,
        norms: batch.norms,
        rel: batch.rel,
        mags: batch.mags,
        memory_value: batch.memory_value,
    };
    Ok(crate::kernels::loss_op::apply(s, op)?)
}

#[cfg(not(feature = "cuda"))]
fn run(_: &Tensor, _: Batch) -> Result<Tensor> {
    Err(crate::error::Error::invalid(
        "device",
        "the RaMBO kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::Params;
    use crate::kernels::loss_op::KernelLoss;
    use crate::kernels::{instance, per_entry, per_row, ptx, Float};
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::Layout;
    use std::sync::Arc;

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_rambo";

    // SAFETY: `Params` is `repr(C)` plain data with the layout of `struct rw_rambo`.
    unsafe impl DeviceRepr for Params {}

    /// One merge pass's parameters (`struct rw_merge` of `device.cu`, same layout).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct Merge {
        stride: u32,
        width: u32,
        len: u32,
        per_row: i32,
        include_self: i32,
    }

    // SAFETY: `Merge` is `repr(C)` plain data with the layout of `struct rw_merge`.
    unsafe impl DeviceRepr for Merge {}

    /// RaMBO of the `B × B` similarities: the shifted sequences, their sorted rows, the ranks,
    /// each query's sum of its terms and the loss in the forward pass; the perturbed sequences,
    /// their sorted relevant groups and the blackbox re-ranking, reading the incoming gradient
    /// on the device, in the backward pass.
    pub(super) struct RamboOp {
        pub(super) params: Params,
        pub(super) ids: Vec<u32>,
        pub(super) norms: Vec<f64>,
        pub(super) rel: Vec<u32>,
        pub(super) mags: Option<Vec<f64>>,
        pub(super) memory_value: f64,
    }

    /// A sorted row per query: the scores (keys) and their columns.
    struct Sorted {
        key: CudaSlice<f64>,
        col: CudaSlice<u32>,
    }

    /// What the backward pass reads: `[rk | rk⁺ | y]` (`3 B²` values), the sorted shifted rows
    /// and the classes, normalisers and relevant counts the forward pass uploaded.
    pub(super) struct RankState {
        stats: CudaSlice<f64>,
        sorted: Sorted,
        cls: CudaSlice<u32>,
        norms: CudaSlice<f64>,
        rel: CudaSlice<u32>,
    }

    /// Merges runs of `first.width` entries of `rows` rows (laid out and sized as `first`
    /// says) until a run holds `longest` entries: the sorted rows.
    fn merge_runs(
        dev: &CudaDevice,
        mut sorted: Sorted,
        cls: &CudaSlice<u32>,
        rel: &CudaSlice<u32>,
        rows: usize,
        longest: u32,
        first: Merge,
    ) -> candle_core::Result<Sorted> {
        if first.width >= longest {
            return Ok(sorted);
        }
        let module = ptx(MODULE, SOURCE)?;
        let f = dev.get_or_load_custom_func("rankwise_rambo_merge", MODULE, module)?;
        let len = rows * first.stride as usize;
        // SAFETY: each pass writes every entry of the rows' first `len` (or `rel[q]`) entries, a
        // permutation of the entries it reads; nothing reads the rest.
        let mut spare = Sorted {
            key: unsafe { dev.alloc::<f64>(len)? },
            col: unsafe { dev.alloc::<u32>(len)? },
        };
        let mut m: Merge = first;
        while m.width < longest {
            let mut l = f.builder();
            l.arg(&sorted.key)
                .arg(&sorted.col)
                .arg(cls)
                .arg(rel)
                .arg(&m)
                .arg(&mut spare.key)
                .arg(&mut spare.col);
            // SAFETY: `key`, `col` hold `rows × stride` values, `cls` and `rel` `rows`, and no
            // row has more than `longest ≤ stride` entries.
            unsafe { l.launch(per_entry(rows, longest as usize)) }.w()?;
            std::mem::swap(&mut sorted, &mut spare);
            m.width = m.width.saturating_mul(2);
        }
        Ok(sorted)
    }

    impl KernelLoss for RamboOp {
        type Saved = Arc<RankState>;
        const NAME: &'static str = "rankwise-rambo";
        const GRAD_NAME: &'static str = "rankwise-rambo-gradient";

        fn dims(&self, _: &Layout) -> (usize, usize) {
            (self.ids.len(), self.ids.len())
        }

        fn forward<T: Float>(
            &self,
            dev: &CudaDevice,
            s: &CudaView<T>,
            (b, _): (usize, usize),
        ) -> candle_core::Result<(CudaSlice<T>, Self::Saved)> {
            let bb = b * b;
            let p: Params = self.params;
            let cls = dev.clone_htod(&self.ids)?;
            let norms = dev.clone_htod(&self.norms)?;
            let rel = dev.clone_htod(&self.rel)?;
            // The deterministic margin reads no magnitude: one value stands for the argument.
            let mags = match &self.mags {
                Some(m) => dev.clone_htod(m)?,
                None => dev.alloc_zeros::<f64>(1)?,
            };
            let mut stats = dev.alloc_zeros::<f64>(3 * bb)?;
            // Zeros: the ranks kernel writes a term for the relevant items only.
            let mut term = dev.alloc_zeros::<f64>(bb)?;
            // SAFETY: the shift kernel writes every entry of the runs (a permutation of each
            // run's positions), the row-sums kernel each of the `B` sums, the total kernel the
            // loss, before anything reads them.
            let mut runs = Sorted {
                key: unsafe { dev.alloc::<f64>(bb)? },
                col: unsafe { dev.alloc::<u32>(bb)? },
            };
            let mut row_sums = unsafe { dev.alloc::<f64>(b)? };
            let mut loss = unsafe { dev.alloc::<T>(1)? };
            let module = ptx(MODULE, SOURCE)?;
            {
                let (_, mut y) = stats.split_at_mut(2 * bb);
                let f = dev.get_or_load_custom_func(
                    &instance::<T>("rankwise_rambo_shift"),
                    MODULE,
                    module,
                )?;
                let mut l = f.builder();
                l.arg(s)
                    .arg(&cls)
                    .arg(&mags)
                    .arg(&p)
                    .arg(&mut y)
                    .arg(&mut runs.key)
                    .arg(&mut runs.col);
                // SAFETY: `s`, `y`, `key` and `col` hold `B × B` values, `cls` `B`, `mags`
                // `B × B` when the kernel reads it (`half_normal`, set only with the
                // magnitudes).
                unsafe { l.launch(per_entry(b, b)) }.w()?;
            }
            let nb = b as u32;
            // Every row whole: `B` entries.
            let whole = Merge {
                stride: nb,
                width: p.tile,
                len: nb,
                per_row: 0,
                include_self: p.include_self,
            };
            let sorted = merge_runs(dev, runs, &cls, &rel, b, nb, whole)?;
            {
                let (mut ranks, y) = stats.split_at_mut(2 * bb);
                let (mut rank, mut rank_rel) = ranks.split_at_mut(bb);
                let y = y.as_view();
                let f = dev.get_or_load_custom_func("rankwise_rambo_ranks", MODULE, module)?;
                let mut l = f.builder();
                l.arg(&y)
                    .arg(&sorted.key)
                    .arg(&sorted.col)
                    .arg(&cls)
                    .arg(&rel)
                    .arg(&norms)
                    .arg(&p)
                    .arg(&mut rank)
                    .arg(&mut rank_rel)
                    .arg(&mut term);
                // SAFETY: `y`, `key`, `col`, `rank`, `rank_rel` and `term` hold `B × B`
                // values, `cls`, `rel` and `norms` `B`.
                unsafe { l.launch(per_entry(b, b)) }.w()?;
            }
            let f = dev.get_or_load_custom_func("rankwise_rambo_row_sums", MODULE, module)?;
            let mut l = f.builder();
            l.arg(&term).arg(&nb).arg(&mut row_sums);
            // SAFETY: `term` holds `B × B` values, `row_sums` `B`.
            unsafe { l.launch(per_row(b)) }.w()?;
            let f = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_rambo_total"),
                MODULE,
                module,
            )?;
            let mut l = f.builder();
            l.arg(&row_sums)
                .arg(&nb)
                .arg(&self.memory_value)
                .arg(&p.objective)
                .arg(&mut loss);
            // SAFETY: one thread reads the `B` row sums and writes the loss.
            unsafe { l.launch(per_row(1)) }.w()?;
            let state = RankState {
                stats,
                sorted,
                cls,
                norms,
                rel,
            };
            Ok((loss, Arc::new(state)))
        }

        fn backward<T: Float>(
            &self,
            dev: &CudaDevice,
            _: &CudaView<T>,
            g: &CudaView<T>,
            saved: &Self::Saved,
            (b, _): (usize, usize),
        ) -> candle_core::Result<CudaSlice<T>> {
            let bb = b * b;
            let p: Params = self.params;
            let stats = &saved.stats;
            let (rank, rank_rel) = (stats.slice(0..bb), stats.slice(bb..2 * bb));
            let y = stats.slice(2 * bb..3 * bb);
            // The perturbed relevant groups, `longest` entries per row at most.
            let longest = self.rel.iter().copied().max().unwrap_or(0);
            let stride = (longest as usize).max(1);
            // SAFETY: the perturbation kernel writes every entry of the sequences, which are
            // all the later kernels read (a query's own entry neither writes nor reads unless
            // `include_self`); the tiles kernel every entry of each row's relevant group, a
            // permutation of its positions, all that the merges and the blackbox kernel read.
            let mut z = unsafe { dev.alloc::<f64>(bb)? };
            let mut runs = Sorted {
                key: unsafe { dev.alloc::<f64>(b * stride)? },
                col: unsafe { dev.alloc::<u32>(b * stride)? },
            };
            // Zeros: a query's own entry, outside its sequence, gets no gradient unless
            // `include_self`.
            let mut jac = dev.alloc_zeros::<T>(bb)?;
            let module = ptx(MODULE, SOURCE)?;
            let f = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_rambo_perturb"),
                MODULE,
                module,
            )?;
            let mut l = f.builder();
            l.arg(&saved.cls)
                .arg(&saved.norms)
                .arg(&p)
                .arg(g)
                .arg(&rank)
                .arg(&rank_rel)
                .arg(&y)
                .arg(&mut z);
            // SAFETY: `rank`, `rank_rel`, `y` and `z` hold `B × B` values, `cls` and `norms`
            // `B`, `g` one.
            unsafe { l.launch(per_entry(b, b)) }.w()?;
            let zstride = stride as u32;
            if longest > 0 {
                let f =
                    dev.get_or_load_custom_func("rankwise_rambo_perturbed_tiles", MODULE, module)?;
                let mut l = f.builder();
                l.arg(&z)
                    .arg(&saved.sorted.col)
                    .arg(&saved.rel)
                    .arg(&p)
                    .arg(&zstride)
                    .arg(&mut runs.key)
                    .arg(&mut runs.col);
                // SAFETY: `z` and `col` hold `B × B` values, `rel` `B`, `key` and `col` of the
                // runs `B × stride`, and no row has more than `longest ≤ stride` relevant items.
                unsafe { l.launch(per_entry(b, longest as usize)) }.w()?;
            }
            // Each row's relevant group: `rel[q]` entries.
            let groups = Merge {
                stride: zstride,
                width: p.tile,
                len: 0,
                per_row: 1,
                include_self: p.include_self,
            };
            let zsorted = merge_runs(dev, runs, &saved.cls, &saved.rel, b, longest, groups)?;
            let f = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_rambo_blackbox"),
                MODULE,
                module,
            )?;
            let mut l = f.builder();
            l.arg(&p)
                .arg(&rank)
                .arg(&z)
                .arg(&saved.sorted.key)
                .arg(&saved.sorted.col)
                .arg(&zsorted.key)
                .arg(&zsorted.col)
                .arg(&saved.rel)
                .arg(&zstride)
                .arg(&mut jac);
            // SAFETY: `rank`, `z`, the sorted rows and `jac` hold `B × B` values, the perturbed
            // relevant rows `B × stride` (at most `stride` read per row), `rel` `B`.
            unsafe { l.launch(per_entry(b, b)) }.w()?;
            Ok(jac)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::rambo::{Averaging, MarginMode};
    use candle_core::{Device, Var};

    /// The kernels of `device.cu` run on the host by the harness (blocks of 6 threads), with
    /// runs of `tile` entries before the merges: `(loss, ∂L/∂s)` with incoming gradient `up`,
    /// the loss in the input's precision.
    fn emulate(s: &[f64], f32_s: bool, batch: &Batch, up: f64, tile: u32) -> (f64, Vec<f64>) {
        let b = batch.ids.len();
        let mut input = Vec::new();
        input.extend((b as u32).to_le_bytes());
        input.extend(u32::from(f32_s).to_le_bytes());
        input.extend(up.to_le_bytes());
        input.extend(batch.memory_value.to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, s, f32_s);
        for &c in &batch.ids {
            input.extend(c.to_le_bytes());
        }
        for &w in &batch.norms {
            input.extend(w.to_le_bytes());
        }
        for &r in &batch.rel {
            input.extend(r.to_le_bytes());
        }
        // The magnitudes, zeros for the deterministic margin (the kernels then read none).
        let zeros = vec![0.0; b * b];
        for &m in batch.mags.as_ref().unwrap_or(&zeros) {
            input.extend(m.to_le_bytes());
        }
        // `Params` field by field, in `struct rw_rambo`'s order.
        let p = batch.params;
        input.extend(p.b.to_le_bytes());
        input.extend(p.include_self.to_le_bytes());
        input.extend(p.margin.to_le_bytes());
        input.extend(p.objective.to_le_bytes());
        input.extend(p.normalised.to_le_bytes());
        input.extend(p.lambda.to_le_bytes());
        input.extend(p.count_scale.to_le_bytes());
        input.extend(p.half_normal.to_le_bytes());
        input.extend(tile.to_le_bytes());
        let out = crate::kernels::emulation::run("rambo", &input);
        assert_eq!(out.len(), 1 + b * b);
        (out[0], out[1..].to_vec())
    }

    /// One engine's value, embeddings' gradient of `up · loss` and the batch's sequences.
    type Outcome = (f64, Vec<f64>, ScoreRows);

    /// By the row engine and by the emulated kernels with runs of `tile` (the loss kernel's
    /// value, the gradient attached as `Σ s ⊙ J − detach`, the sequences from [`sequences`]),
    /// with the stored sequences of `memory`, each from the same pass count.
    #[allow(clippy::too_many_arguments)]
    fn both(
        loss: &Rambo,
        labels: &Labels,
        e: &[f64],
        d: usize,
        dtype: DType,
        up: f64,
        memory: &ScoreMemory,
        tile: u32,
    ) -> [Outcome; 2] {
        let b = labels.len();
        let var = Var::from_tensor(
            &Tensor::from_vec(e.to_vec(), (b, d), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        let grad_of = |l: &Tensor| {
            let g = l.backward().unwrap();
            g.get(var.as_tensor())
                .map(|g| {
                    g.to_dtype(DType::F64)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap()
                })
                .unwrap_or_else(|| vec![0.0; b * d])
        };
        let scalar = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
        // The twin starts from the same pass count: the same half-normal draws.
        let twin = loss.clone();
        let (reference, kept) = loss
            .forward_with_memory(var.as_tensor(), labels, memory)
            .unwrap();
        let reference = (
            scalar(&reference),
            grad_of(&(reference * up).unwrap()),
            kept,
        );
        let rows = twin.rows(labels, memory, true).unwrap();
        let batch = Batch::new(&rows, labels).unwrap();
        let en = l2_normalize(var.as_tensor(), "embeddings").unwrap();
        let s = en.matmul(&en.t().unwrap()).unwrap();
        let flat: Vec<f64> = s
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (value, jac) = emulate(&flat, dtype == DType::F32, &batch, up, tile);
        let j = Tensor::from_vec(jac, (b, b), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let lin = (&s * j).unwrap().sum_all().unwrap();
        let attached = (&lin - lin.detach()).unwrap();
        let kernels = (value, grad_of(&attached), sequences(&rows, &s).unwrap());
        assert_eq!(twin.passes.get(), loss.passes.get());
        [reference, kernels]
    }

    /// Two stored batches of 9 and 12 sequences (one of them without a relevant item), from
    /// other embeddings, as `forward_with_memory` stores them.
    fn stored_batches(d: usize) -> ScoreMemory {
        let mut memory = ScoreMemory::new(2);
        for (n, seed) in [(9usize, 11u64), (12, 12)] {
            let mut fine: Vec<i64> = (0..n as i64).map(|i| i % 4).collect();
            fine[n - 1] = 7;
            let labels = Labels::from_fine(&fine).unwrap();
            let e = crate::kernels::emulation::uniform(n * d, seed);
            let x = Tensor::from_vec(e, (n, d), &Device::Cpu).unwrap();
            let (_, rows) = Rambo::default()
                .forward_with_memory(&x, &labels, &ScoreMemory::new(0))
                .unwrap();
            memory.push(rows);
        }
        assert_eq!(memory.num_sequences(), 21);
        memory
    }

    #[test]
    fn the_kernels_equal_the_row_engine_for_every_option() {
        let (b, d) = (26, 5);
        // Class = i mod 5, with a singleton class (item 25 → class 9): a query without
        // relevant item.
        let mut fine: Vec<i64> = (0..b as i64).map(|i| i % 5).collect();
        fine[25] = 9;
        let labels = Labels::from_fine(&fine).unwrap();
        // Items 5 and 6 duplicate items 0 and 1 of their classes: exact ties in the ranks.
        let mut e = crate::kernels::emulation::uniform(b * d, 3);
        for (from, to) in [(0, 5), (1, 6)] {
            let row: Vec<f64> = e[from * d..(from + 1) * d].to_vec();
            e[to * d..(to + 1) * d].copy_from_slice(&row);
        }
        let half_normal = MarginMode::HalfNormal { seed: 5 };
        let variants = [
            ("AP", Rambo::ap()),
            ("recall log", Rambo::recall(RecallWeight::Log)),
            ("recall log log (default)", Rambo::default()),
            (
                "authors' recall",
                Rambo::authors_recall(RecallWeight::Log, 2.0, 0.05),
            ),
            (
                "AP, self kept, ε, integer ranks",
                Rambo {
                    include_self: true,
                    ap_epsilon: 1e-5,
                    units: RankUnits::Integer,
                    lambda: 0.5,
                    ..Rambo::ap()
                },
            ),
            (
                "AP, no margin, pooled",
                Rambo {
                    margin: 0.0,
                    averaging: Averaging::PooledPositives,
                    ..Rambo::ap()
                },
            ),
            (
                "recall, wide margin",
                Rambo {
                    margin: 0.4,
                    ..Rambo::default()
                },
            ),
            ("ROADMAP's BlackBoxAP (half-normal)", {
                let l = Rambo::roadmap_blackbox_ap(7);
                // A later pass: the draws depend on the count.
                l.passes.set(3);
                Rambo { margin: 0.3, ..l }
            }),
            (
                "recall log log, half-normal, wide margin",
                Rambo {
                    margin: 0.4,
                    margin_mode: half_normal,
                    ..Rambo::default()
                },
            ),
            (
                "authors' recall, half-normal",
                Rambo {
                    margin_mode: half_normal,
                    ..Rambo::authors_recall(RecallWeight::LogLog, 4.0, 0.3)
                },
            ),
        ];
        let stored = stored_batches(d);
        for (name, loss) in variants {
            for (memory, with) in [(ScoreMemory::new(0), ""), (stored.clone(), ", memory")] {
                for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
                    // Runs of 1 and 4 entries merge 5 and 3 times; one run of TILE, never.
                    for (up, tile) in [(1.0, 1), (2.5, 4), (1.0, TILE)] {
                        let [(rv, rg, rs), (kv, kg, ks)] =
                            both(&loss, &labels, &e, d, dtype, up, &memory, tile);
                        let what = format!("{name}{with} {dtype:?} up={up} tile={tile}");
                        assert!(
                            (rv - kv).abs() <= tol * (1.0 + rv.abs()),
                            "{what}: {kv} vs {rv}"
                        );
                        assert!(
                            rg.iter().any(|&g| g != 0.0),
                            "{what}: no gradient to compare"
                        );
                        for (i, (r, k)) in rg.iter().zip(&kg).enumerate() {
                            assert!(
                                (r - k).abs() <= tol * (1.0 + r.abs()),
                                "{what} grad[{i}]: {k} vs {r}"
                            );
                        }
                        // The sequences to store: the same relevance, the same scores.
                        assert_eq!(rs.len(), b, "{what}");
                        for ((r, rr), (k, kr)) in rs.iter().zip(ks.iter()) {
                            assert_eq!(rr, kr, "{what}");
                            assert!(
                                r.iter().zip(k).all(|(r, k)| (r - k).abs() <= tol),
                                "{what}: stored scores"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_stored_sequences_change_the_value_and_the_gradient() {
        // The memory's terms and counts must reach the kernels' inputs, or the test above
        // could pass with the memory ignored by both engines.
        let (b, d) = (12, 4);
        let labels = Labels::from_fine(&(0..b as i64).map(|i| i % 3).collect::<Vec<_>>()).unwrap();
        let e = crate::kernels::emulation::uniform(b * d, 8);
        let loss = Rambo::authors_recall(RecallWeight::Log, 4.0, 0.1);
        let none = ScoreMemory::new(0);
        let [(v0, g0, _), _] = both(&loss, &labels, &e, d, DType::F64, 1.0, &none, 3);
        let [(v1, g1, _), (k1, _, _)] = both(
            &loss,
            &labels,
            &e,
            d,
            DType::F64,
            1.0,
            &stored_batches(d),
            3,
        );
        assert!((v0 - v1).abs() > 1e-6 && (k1 - v1).abs() < 1e-12);
        assert!(g0.iter().zip(&g1).any(|(a, b)| (a - b).abs() > 1e-9));
    }

    #[test]
    fn every_run_length_gives_the_same_bits_and_the_row_engine_values() {
        // Three classes of 23 and a singleton: relevant groups of 22 and 23 entries, sorted
        // again after the perturbation in several passes; rows 10–19 repeat rows 0–9 (exact
        // ties across both groups) and the first coordinate is on a coarse grid (more ties).
        let (b, d) = (70, 4);
        let mut fine: Vec<i64> = (0..b as i64).map(|i| i % 3).collect();
        fine[69] = 5;
        let labels = Labels::from_fine(&fine).unwrap();
        let mut e = crate::kernels::emulation::uniform(b * d, 21);
        for i in 0..b {
            e[i * d] = (e[i * d] * 4.0).round() / 4.0 + 0.5;
        }
        for i in 10..20 {
            let row: Vec<f64> = e[(i - 10) * d..(i - 9) * d].to_vec();
            e[i * d..(i + 1) * d].copy_from_slice(&row);
        }
        let variants = [
            ("AP", Rambo::ap()),
            ("recall log log", Rambo::default()),
            (
                "AP, self kept",
                Rambo {
                    include_self: true,
                    ..Rambo::ap()
                },
            ),
            (
                "recall, half-normal",
                Rambo {
                    margin: 0.3,
                    margin_mode: MarginMode::HalfNormal { seed: 2 },
                    ..Rambo::default()
                },
            ),
        ];
        for (name, loss) in variants {
            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
                let memory = ScoreMemory::new(0);
                let outcomes: Vec<(u32, Outcome)> = [1, 3, 8, TILE, 128]
                    .into_iter()
                    .map(|tile| {
                        // A clone for each: the same pass count, so the same half-normal draws.
                        let loss = loss.clone();
                        let [r, k] = both(&loss, &labels, &e, d, dtype, 1.5, &memory, tile);
                        let what = format!("{name} {dtype:?} tile={tile}");
                        assert!((r.0 - k.0).abs() <= tol * (1.0 + r.0.abs()), "{what}");
                        for (i, (r, k)) in r.1.iter().zip(&k.1).enumerate() {
                            assert!((r - k).abs() <= tol * (1.0 + r.abs()), "{what} [{i}]");
                        }
                        (tile, k)
                    })
                    .collect();
                let (_, first) = &outcomes[0];
                for (tile, k) in &outcomes[1..] {
                    assert_eq!(k.0.to_bits(), first.0.to_bits(), "{name} {dtype:?} {tile}");
                    assert!(
                        k.1.iter()
                            .zip(&first.1)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{name} {dtype:?} tile {tile}: the gradient's bits"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_groups_are_the_row_engine_values() {
        // One class (no irrelevant item) and all singletons (no relevant item: the value is the
        // stored sequences' alone, and no perturbed group is sorted), each row in one run and
        // in runs of 2.
        let d = 3;
        let stored = stored_batches(d);
        for (fine, memory) in [
            (vec![4i64; 9], ScoreMemory::new(0)),
            ((0..7).collect::<Vec<i64>>(), stored),
        ] {
            let b = fine.len();
            let labels = Labels::from_fine(&fine).unwrap();
            let e = crate::kernels::emulation::uniform(b * d, 31);
            for loss in [Rambo::ap(), Rambo::default()] {
                for tile in [2, TILE] {
                    let [r, k] = both(&loss, &labels, &e, d, DType::F64, 1.0, &memory, tile);
                    assert!((r.0 - k.0).abs() <= 1e-12, "{fine:?} tile {tile}");
                    assert!(
                        r.1.iter().zip(&k.1).all(|(r, k)| (r - k).abs() <= 1e-12),
                        "{fine:?} tile {tile}: gradient"
                    );
                }
            }
        }
    }

    #[test]
    fn the_work_bound_keeps_b_16384_on_the_device() {
        assert_eq!(work(1), Some(TILE as usize));
        assert_eq!(work(4096), Some(4096 * 4096 * (TILE as usize + 144)));
        assert!(work(16_384).unwrap() <= crate::kernels::DEFAULT_MAX_WORK);
        assert!(work(32_768).unwrap() > crate::kernels::DEFAULT_MAX_WORK);
        assert_eq!(work(usize::MAX), None);
    }

    #[test]
    fn a_batch_without_relevant_item_is_the_row_engine_error() {
        let err = normalisers(&Rambo::default(), &[0, 1, 2], &[]).unwrap_err();
        assert!(
            err.to_string().contains("no query has a relevant item"),
            "{err}"
        );
        // Kept in its own sequence, each query is its own relevant item.
        let keep = Rambo {
            include_self: true,
            ..Rambo::default()
        };
        assert_eq!(normalisers(&keep, &[0, 1, 2], &[]).unwrap().0.len(), 3);
        // A stored sequence with a relevant item makes the batch defined (value only).
        let (norms, _, _) =
            normalisers(&Rambo::default(), &[0, 1, 2], &[None, Some((0.5, 2))]).unwrap();
        assert_eq!(norms, vec![0.0; 3]);
    }

    #[test]
    fn the_device_path_applies_only_on_cuda() {
        let x = Tensor::zeros((8, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(!applies(&Rambo::default(), &x));
        assert_eq!(std::mem::size_of::<Params>(), 48);
    }
}

//! RaMBO on a CUDA device: ranks, loss terms and the blackbox gradient by kernels of its own,
//! with no host pass.
//!
//! The row engine of [`super::Rambo`] ranks each query's sequence on the host: on a GPU the
//! `B × B` similarities travel to the host and the gradient back, which left RaMBO at 2.2×
//! PyTorch's formulation at B = 256 on the H200 (2026-11-26), under the 3× target. Here the
//! kernels of `device.cu` beside this file compute, one thread per (query `q`, item `j`) of the
//! shifted sequence `y = s − α(y* − ½)` (Eq. 14):
//!
//! ```text
//! ranks (thread (q, j)):     rk_j = 1 + |{k : y_k ahead of y_j}|,  rk⁺_j = 1 + |{relevant k ahead}|
//!                            (ahead: larger, or equal and earlier — the host's tie rule)
//!                            term_j = w_q · Prec(j) = w_q rk⁺_j / rk_j          (AP, Eq. 21)
//!                                   = w_q · ℓ((rk_j − rk⁺_j) · c)               (recall, Eq. 20)
//! blackbox (thread (q, j)):  g_k = ∂L/∂rk_k of the relevant k (in the ranks' units, times the
//!                            incoming gradient), from rk_k, rk⁺_k;
//!                            ∂L/∂y_j = −(rk_j − rk_j(y + λ g)) / λ             (Algorithm 1)
//! loss = 1 − Σ term (AP) or Σ term (recall)
//! ```
//!
//! with `w_q` the query's normaliser (`1/(Q (P_q + ε))` per query, `1/P_total` pooled), which
//! depends on the labels only (and on the stored sequences' counts) and is computed on the
//! host. The first kernel runs once per step: its terms give the value, its ranks and shifted
//! sequences are kept for the backward, which runs the blackbox kernel with the incoming
//! gradient read on the device (the blackbox gradient is not linear in it: the perturbation is
//! `λ` times it), so the loss keeps its exact host semantics inside any weighted sum. The work
//! is `O(B³)` (each thread counts over its sequence), so the kernels are used up to
//! `B³ ≤` [`crate::kernels::max_work`]; beyond, the row engine.
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
//! the half-normal margin and a score memory, with exact ties and a scaled incoming gradient;
//! the GPU check compares every RaMBO option on CUDA with the CPU.

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

/// Whether `loss` on `embeddings` runs on the device: [`crate::kernels::on_cuda`], no query
/// chunk asked, and `B³ ≤` [`crate::kernels::max_work`].
pub(super) fn applies(loss: &Rambo, embeddings: &Tensor) -> bool {
    let Ok(b) = embeddings.dim(0) else {
        return false;
    };
    loss.query_chunk.is_none()
        && b.checked_pow(3)
            .is_some_and(|w| w <= crate::kernels::max_work())
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
        let (norms, memory_value) = normalisers(loss, &ids, &rows.memory_terms)?;
        let mags = magnitudes(rows, ids.len());
        Ok(Batch {
            params: params(loss, ids.len(), rows.num_sequences, mags.is_some()),
            ids,
            norms,
            mags,
            memory_value,
        })
    }
}

/// Each query's normaliser `w_q` (0 without a relevant item), from the labels and the stored
/// sequences' `(term, relevant items)`, and the stored sequences' share of the value; the row
/// engine's error when no sequence has a relevant item.
fn normalisers(
    loss: &Rambo,
    ids: &[u32],
    memory_terms: &[Option<(f64, usize)>],
) -> Result<(Vec<f64>, f64)> {
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
    Ok((norms, memory_value))
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

/// The loss from the first kernel's `terms` (`B × B`, `f64`) and the stored sequences' share.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn value(loss: &Rambo, terms: &Tensor, memory_value: f64) -> Result<Tensor> {
    let total = terms.sum_all()?.affine(1.0, memory_value)?;
    Ok(match loss.objective {
        RamboObjective::Ap => total.affine(-1.0, 1.0)?,
        RamboObjective::Recall(_) => total,
    })
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
    let value = run(loss, &s, batch)?;
    let kept = if keep {
        sequences(&rows, &s)?
    } else {
        ScoreRows::default()
    };
    Ok((value, kept))
}

#[cfg(feature = "cuda")]
fn run(loss: &Rambo, s: &Tensor, batch: Batch) -> Result<Tensor> {
    let b = batch.ids.len();
    let bb = b * b;
    let mags = match &batch.mags {
        Some(m) => Tensor::from_slice(m, (b, b), s.device())?,
        None => Tensor::zeros(1, DType::F64, s.device())?,
    };
    let op = cuda::Rambo {
        params: batch.params,
        ids: batch.ids,
        norms: batch.norms,
    };
    let sims = s.contiguous()?;
    // [rk | rk⁺ | terms | y], ranked once: the value reads the terms, the backward the ranks and
    // the shifted sequences.
    let stats = sims
        .detach()
        .apply_op2_no_bwd(&mags, &cuda::Ranks(op.clone()))?;
    let value =
        value(loss, &stats.narrow(0, 2 * bb, bb)?, batch.memory_value)?.to_dtype(s.dtype())?;
    // Zero, with the blackbox gradient as its backward.
    let zero = sims.apply_op2(&stats, op)?;
    Ok((value + zero)?)
}

#[cfg(not(feature = "cuda"))]
fn run(_: &Rambo, _: &Tensor, _: Batch) -> Result<Tensor> {
    Err(crate::error::Error::invalid(
        "device",
        "the RaMBO kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::Params;
    use crate::kernels::{
        check_matrix, dtype_error, instance, not_on_cpu, per_entry, ptx, view, Float,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{
        CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor,
    };

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_rambo";

    // SAFETY: `Params` is `repr(C)` plain data with the layout of `struct rw_rambo`.
    unsafe impl DeviceRepr for Params {}

    /// The batch's classes and normalisers; as an op on the similarities and the ranks of
    /// [`Ranks`], its forward is a zero scalar and its backward the blackbox gradient.
    #[derive(Clone)]
    pub(super) struct Rambo {
        pub(super) params: Params,
        pub(super) ids: Vec<u32>,
        pub(super) norms: Vec<f64>,
    }

    /// `(s, half-normal magnitudes) → [rk | rk⁺ | terms | y]`, `4 B²` `f64` values: the first
    /// kernel.
    pub(super) struct Ranks(pub(super) Rambo);

    /// `(s, [rk | rk⁺ | terms | y], ∂L/∂loss) → ∂L/∂s`: the blackbox kernel.
    struct Gradient(Rambo);

    /// The `f64` values of the first kernel's output.
    const STATS: usize = 4;

    impl Rambo {
        fn grid(&self) -> LaunchConfig {
            per_entry(self.ids.len(), self.ids.len())
        }

        fn ranks<T: Float>(
            &self,
            dev: &CudaDevice,
            s: &CudaView<T>,
            mags: &CudaView<f64>,
        ) -> candle_core::Result<CudaSlice<f64>> {
            let bb = self.ids.len() * self.ids.len();
            let cls = dev.clone_htod(&self.ids)?;
            let norms = dev.clone_htod(&self.norms)?;
            let mut stats = dev.alloc_zeros::<f64>(STATS * bb)?;
            {
                let (mut rank, mut rest) = stats.split_at_mut(bb);
                let (mut rank_rel, mut rest) = rest.split_at_mut(bb);
                let (mut term, mut y) = rest.split_at_mut(bb);
                let name = instance::<T>("rankwise_rambo_ranks");
                let f = dev.get_or_load_custom_func(&name, MODULE, ptx(MODULE, SOURCE)?)?;
                let mut l = f.builder();
                l.arg(s)
                    .arg(&cls)
                    .arg(&norms)
                    .arg(mags)
                    .arg(&self.params)
                    .arg(&mut rank)
                    .arg(&mut rank_rel)
                    .arg(&mut term)
                    .arg(&mut y);
                // SAFETY: `s`, `rank`, `rank_rel`, `term`, `y` hold `B × B` values, `cls` and
                // `norms` `B`, `mags` `B × B` when the kernel reads it (`half_normal`, checked
                // by the op).
                unsafe { l.launch(self.grid()) }.w()?;
            }
            Ok(stats)
        }

        fn gradient<T: Float>(
            &self,
            dev: &CudaDevice,
            stats: &CudaView<f64>,
            up: &CudaView<T>,
        ) -> candle_core::Result<CudaSlice<T>> {
            let bb = self.ids.len() * self.ids.len();
            let cls = dev.clone_htod(&self.ids)?;
            let norms = dev.clone_htod(&self.norms)?;
            let (rank, rank_rel) = (stats.slice(0..bb), stats.slice(bb..2 * bb));
            let y = stats.slice(3 * bb..4 * bb);
            let mut jac = dev.alloc_zeros::<T>(bb)?;
            let name = instance::<T>("rankwise_rambo_blackbox");
            let f = dev.get_or_load_custom_func(&name, MODULE, ptx(MODULE, SOURCE)?)?;
            let mut l = f.builder();
            l.arg(&cls)
                .arg(&norms)
                .arg(&self.params)
                .arg(up)
                .arg(&rank)
                .arg(&rank_rel)
                .arg(&y)
                .arg(&mut jac);
            // SAFETY: as in `ranks`; `up` holds one value, `jac` `B × B`.
            unsafe { l.launch(self.grid()) }.w()?;
            Ok(jac)
        }
    }

    impl CustomOp2 for Ranks {
        fn name(&self) -> &'static str {
            "rankwise-rambo-ranks"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<(CpuStorage, Shape)> {
            Err(not_on_cpu(self.name()))
        }

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
            mags: &CudaStorage,
            ml: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let b = self.0.ids.len();
            check_matrix(self.name(), l, b, b)?;
            if self.0.params.half_normal != 0 {
                check_matrix(self.name(), ml, b, b)?;
            }
            let dev = s.device().clone();
            let mags = view::<f64>(mags, ml)?;
            let stats = match s.dtype() {
                DType::F32 => self.0.ranks::<f32>(&dev, &view(s, l)?, &mags)?,
                DType::F64 => self.0.ranks::<f64>(&dev, &view(s, l)?, &mags)?,
                d => return Err(dtype_error(self.name(), d)),
            };
            Ok((
                CudaStorage::wrap_cuda_slice(stats, dev),
                Shape::from(STATS * b * b),
            ))
        }
    }

    impl CustomOp2 for Rambo {
        fn name(&self) -> &'static str {
            "rankwise-rambo"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<(CpuStorage, Shape)> {
            Err(not_on_cpu(self.name()))
        }

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
            _: &CudaStorage,
            _: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            check_matrix(self.name(), l, self.ids.len(), self.ids.len())?;
            let dev = s.device().clone();
            let zero = match s.dtype() {
                DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f32>(1)?, dev),
                DType::F64 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f64>(1)?, dev),
                d => return Err(dtype_error(self.name(), d)),
            };
            Ok((zero, Shape::from(())))
        }

        fn bwd(
            &self,
            s: &Tensor,
            stats: &Tensor,
            _: &Tensor,
            grad: &Tensor,
        ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
            let up = grad.to_dtype(s.dtype())?.contiguous()?;
            let jac = s.contiguous()?.apply_op3_no_bwd(
                &stats.contiguous()?,
                &up,
                &Gradient(self.clone()),
            )?;
            Ok((Some(jac), None))
        }
    }

    impl CustomOp3 for Gradient {
        fn name(&self) -> &'static str {
            "rankwise-rambo-gradient"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<(CpuStorage, Shape)> {
            Err(not_on_cpu(self.name()))
        }

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
            stats: &CudaStorage,
            sl: &Layout,
            up: &CudaStorage,
            ul: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let b = self.0.ids.len();
            check_matrix(self.name(), l, b, b)?;
            if sl.shape().elem_count() != STATS * b * b || !sl.is_contiguous() {
                return Err(candle_core::Error::Msg(format!(
                    "rankwise-rambo-gradient: ranks {:?}, expected the {} values of the ranks op",
                    sl.dims(),
                    STATS * b * b
                )));
            }
            if ul.shape().elem_count() != 1 {
                return Err(candle_core::Error::Msg(format!(
                    "rankwise-rambo-gradient: the incoming gradient of a scalar loss has one \
                     value, got {:?}",
                    ul.dims()
                )));
            }
            let dev = s.device().clone();
            let stats = view::<f64>(stats, sl)?;
            let jac = match s.dtype() {
                DType::F32 => CudaStorage::wrap_cuda_slice(
                    self.0.gradient::<f32>(&dev, &stats, &view(up, ul)?)?,
                    dev,
                ),
                DType::F64 => CudaStorage::wrap_cuda_slice(
                    self.0.gradient::<f64>(&dev, &stats, &view(up, ul)?)?,
                    dev,
                ),
                d => return Err(dtype_error(self.name(), d)),
            };
            Ok((jac, l.shape().clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::rambo::{Averaging, MarginMode};
    use candle_core::{Device, Var};

    /// The kernels of `device.cu` run on the host by the harness (blocks of 6 threads):
    /// `(terms, ∂L/∂s)` with incoming gradient `up`.
    fn emulate(s: &[f64], f32_s: bool, batch: &Batch, up: f64) -> (Vec<f64>, Vec<f64>) {
        let b = batch.ids.len();
        let mut input = Vec::new();
        input.extend((b as u32).to_le_bytes());
        input.extend(u32::from(f32_s).to_le_bytes());
        input.extend(up.to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, s, f32_s);
        for &c in &batch.ids {
            input.extend(c.to_le_bytes());
        }
        for &w in &batch.norms {
            input.extend(w.to_le_bytes());
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
        let out = crate::kernels::emulation::run("rambo", &input);
        assert_eq!(out.len(), 2 * b * b);
        let (t, j) = out.split_at(b * b);
        (t.to_vec(), j.to_vec())
    }

    /// One engine's value, embeddings' gradient of `up · loss` and the batch's sequences.
    type Outcome = (f64, Vec<f64>, ScoreRows);

    /// By the row engine and by the emulated kernels (the value from [`value`], the gradient
    /// attached as `Σ s ⊙ J − detach`, the sequences from [`sequences`]), with the stored
    /// sequences of `memory`, each from the same pass count.
    fn both(
        loss: &Rambo,
        labels: &Labels,
        e: &[f64],
        d: usize,
        dtype: DType,
        up: f64,
        memory: &ScoreMemory,
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
        let (terms, jac) = emulate(&flat, dtype == DType::F32, &batch, up);
        let v = value(
            &twin,
            &Tensor::from_vec(terms, (b, b), &Device::Cpu).unwrap(),
            batch.memory_value,
        )
        .unwrap();
        let j = Tensor::from_vec(jac, (b, b), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let lin = (&s * j).unwrap().sum_all().unwrap();
        let attached = (&lin - lin.detach()).unwrap();
        let kernels = (
            scalar(&v),
            grad_of(&attached),
            sequences(&rows, &s).unwrap(),
        );
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
                    for up in [1.0, 2.5] {
                        let [(rv, rg, rs), (kv, kg, ks)] =
                            both(&loss, &labels, &e, d, dtype, up, &memory);
                        let what = format!("{name}{with} {dtype:?} up={up}");
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
        let [(v0, g0, _), _] = both(&loss, &labels, &e, d, DType::F64, 1.0, &ScoreMemory::new(0));
        let [(v1, g1, _), (k1, _, _)] =
            both(&loss, &labels, &e, d, DType::F64, 1.0, &stored_batches(d));
        assert!((v0 - v1).abs() > 1e-6 && (k1 - v1).abs() < 1e-12);
        assert!(g0.iter().zip(&g1).any(|(a, b)| (a - b).abs() > 1e-9));
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
        let (norms, _) =
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

//! The smooth-rank AP and its Jacobian computed on a CUDA device, without the host.
//!
//! The streaming engine ([`super::Engine::Streaming`]) runs on the host: on a GPU, the `Q × N`
//! scores travel to the host, its cores rank them, and the Jacobian travels back — at B = 256
//! on the H200 machine (2026-11-26) that made Smooth-AP 1.7 ms, ROADMAP 3.1 ms and HAPPIER
//! 5.5 ms per step, slower than PyTorch's all-on-GPU formulations for the last two. Here the
//! same quantities come from the kernels of `device.cu` beside this file, one thread per
//! (query, item). For query `q`, its positives `k` (level ≥ 1, in the retrieval set) and the
//! pair category `c` (level of `j` against level of `k`):
//!
//! ```text
//! pass 1, thread (q, k):  rank(k)   = 1      + Σ_{j ≠ k}         R_c(s_j − s_k)
//!                         H-rank(k) = rel(k) + Σ_{j ≠ k, l_j ≥ 1} w_kj N_c(s_j − s_k),  w_kj = min(rel(k), rel(j))
//!                         G(k) = ∂(H-rank(k)/rank(k))/∂s_k = −A_k/rank(k) + H-rank(k) B_k/rank(k)²,
//!                                A_k = Σ_j w_kj N'_c(s_j − s_k),  B_k = Σ_j R'_c(s_j − s_k)
//! pass 2, thread (q, j):  ∂AP/∂s_j = (1/Z) [Σ_{k ≠ j} (w_kj N'_c(s_j − s_k)/rank(k)
//!                                              − H-rank(k) R'_c(s_j − s_k)/rank(k)²) + G(j)]
//! values, thread q:       AP = Σ_k H-rank(k)/rank(k) / Z,  Z = Σ_k rel(k)
//! ```
//!
//! — HAPPIER Eq. (3) and its derivative, Smooth-AP Eq. (5)–(7) when the levels are binary,
//! the same definitions as the streaming engine (including the empty cases: no positive, or
//! `Z ≤ 0`, gives AP 0 and a zero row). Only the pairs with a positive enter these sums, so the
//! host lists each query's positives (`Positives`) and the kernels visit those alone: pass 1
//! is one thread per (query, positive) scanning the `N` items, pass 2 one thread per (query,
//! item) scanning the query's positives — `O(P N)` work per query, `P` its positives, with none
//! of the streaming engine's sorting and counting. With binary labels and `m` images per class
//! in the batch, `P = m − 1`: Smooth-AP at B = 16,384 and 4 per class is `8 · 10⁸` pairs, where a
//! thread per item scanning every item (the first version of these kernels) was `Q N² = 4.4 ·
//! 10¹²`, most of its threads idle. HAPPIER's hierarchical positives (every item of the query's
//! coarse class: half the batch with two coarse classes per batch) keep it near `Q N² / 2`. The
//! kernels are used when `Σ_q P_q · N ≤` [`crate::kernels::max_work`] (`2³⁶` unless
//! `RANKWISE_KERNEL_MAX_WORK` says otherwise) and the streaming engine beyond. Sums are in `f64` like the host's, each in the order of a scan of
//! every item; the sigmoid's `exp` is in the scores' type.
//!
//! **Switch.** `RANKWISE_DEVICE_KERNELS=0` ([`crate::kernels::set_enabled`]) sends everything
//! back to the streaming engine: the same binary measures both.
//!
//! **Tests.** The kernel source is compiled here by NVRTC at run time; the unit test below
//! compiles the same file with the host's C++ compiler, emulating the launch grid
//! (`tests/cuda_emulation/`), and checks values and Jacobians against the streaming engine for
//! every surrogate family; `scripts/build_cuda.sh` compiles it with NVRTC on the build machine;
//! the GPU check compares every smooth-rank loss on CUDA with the CPU.

use super::{PairSurrogates, RankProblem, EXCLUDED};
use crate::error::{Error, Result};
use crate::losses::surrogate::{PieceFn, Upper};
use candle_core::Tensor;

/// The kernels' source, compiled at run time by NVRTC.
#[cfg(feature = "cuda")]
const SOURCE: &str = include_str!("device.cu");

/// Pieces per surrogate the kernels accept (`RW_MAX_PIECES` in `device.cu`).
const MAX_PIECES: usize = 6;
/// Doubles per piece (`RW_PIECE_LEN`).
const PIECE_LEN: usize = 6;
/// Doubles per surrogate (`RW_SLOT_LEN`).
pub(crate) const SLOT_LEN: usize = 1 + MAX_PIECES * PIECE_LEN;

/// Whether the smooth APs of `scores` (`Q × N`) for `problem` are computed by the kernels: a
/// build with the `cuda` feature, scores on a CUDA device in `f32` or `f64`,
/// [`crate::kernels::enabled`], and the work `Σ_q P_q · N` (the queries' positives times the
/// items) at most [`crate::kernels::max_work`].
pub fn applies(scores: &Tensor, problem: &RankProblem) -> bool {
    plan(scores, problem).is_some()
}

/// Every query's positives (level ≥ 1, in the retrieval set), in increasing item order: query
/// `q`'s are `item[start[q]..start[q + 1]]`, and entry `e` belongs to query `query[e]`. The
/// kernels' threads visit these pairs only.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Positives {
    pub(crate) start: Vec<u32>,
    pub(crate) query: Vec<u32>,
    pub(crate) item: Vec<u32>,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Positives {
    /// The lists of `problem`, or `None` when they hold more than `u32::MAX` entries (the
    /// kernels index them with 32-bit integers).
    pub(crate) fn of(problem: &RankProblem) -> Option<Self> {
        let (q, n) = (problem.queries, problem.items);
        let mut start = Vec::with_capacity(q + 1);
        let (mut query, mut item) = (Vec::new(), Vec::new());
        start.push(0);
        if n > 0 {
            for (qi, row) in problem.levels.chunks_exact(n).enumerate() {
                for (j, &l) in row.iter().enumerate() {
                    if l != EXCLUDED && l >= 1 {
                        query.push(qi as u32);
                        item.push(j as u32);
                    }
                }
                start.push(u32::try_from(item.len()).ok()?);
            }
        }
        start.resize(q + 1, item.len() as u32);
        Some(Positives { start, query, item })
    }

    /// The lists of `problem` when the kernels' work, `Σ_q P_q · N`, is within
    /// [`crate::kernels::max_work`].
    pub(crate) fn within_bound(problem: &RankProblem) -> Option<Self> {
        Positives::within(problem, crate::kernels::max_work())
    }

    /// The lists of `problem` when `Σ_q P_q · N ≤ bound` (checked before they are built: a
    /// hierarchical batch of 16,384 would list 10⁸ pairs only to find them beyond it).
    fn within(problem: &RankProblem, bound: usize) -> Option<Self> {
        let work = problem.positive_pairs.checked_mul(problem.items)?;
        if work > bound {
            return None;
        }
        let p = Positives::of(problem)?;
        debug_assert_eq!(p.item.len(), problem.positive_pairs);
        Some(p)
    }
}

/// The six surrogates (rank: lower, equal, higher; H-rank: the same), `SLOT_LEN` doubles each,
/// as `device.cu` reads them.
// Used by the CUDA launch and by the emulation test (so in every test build).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn encode_surrogates(sur: &PairSurrogates) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(6 * SLOT_LEN);
    for s in sur.rank.iter().chain(&sur.hrank) {
        let pieces = s.pieces();
        if pieces.len() > MAX_PIECES {
            return Err(Error::invalid(
                "surrogate",
                format!(
                    "{} pieces, the device kernels take at most {MAX_PIECES}",
                    pieces.len()
                ),
            ));
        }
        let mut slot = vec![0.0; SLOT_LEN];
        slot[0] = pieces.len() as f64;
        for (i, p) in pieces.iter().enumerate() {
            let (kind, bound) = match p.upper {
                Upper::Lt(b) => (0.0, b),
                Upper::Le(b) => (1.0, b),
                Upper::Inf => (2.0, 0.0),
            };
            let (f, a, b, c) = match p.f {
                PieceFn::Const(v) => (0.0, v, 0.0, 0.0),
                PieceFn::Affine {
                    slope,
                    shift,
                    intercept,
                } => (1.0, slope, shift, intercept),
                PieceFn::Sigmoid { tau, add } => (2.0, tau, add, 0.0),
            };
            slot[1 + i * PIECE_LEN..1 + (i + 1) * PIECE_LEN]
                .copy_from_slice(&[kind, bound, f, a, b, c]);
        }
        out.extend(slot);
    }
    Ok(out)
}

/// The inputs of the kernels besides the scores.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone)]
pub(crate) struct KernelProblem<'a> {
    /// The levels (`Q × N`, [`EXCLUDED`] outside the retrieval set) and relevances
    /// (`Q × (L + 1)`).
    pub(crate) problem: &'a RankProblem,
    /// Every query's positives.
    pub(crate) positives: Positives,
    /// [`encode_surrogates`].
    pub(crate) pieces: Vec<f64>,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl<'a> KernelProblem<'a> {
    pub(crate) fn new(
        problem: &'a RankProblem,
        positives: Positives,
        sur: &PairSurrogates,
    ) -> Result<Self> {
        // `device.cu` takes the sizes as 32-bit integers.
        for (what, v) in [("queries", problem.queries), ("items", problem.items)] {
            if u32::try_from(v).is_err() {
                return Err(Error::invalid(
                    what,
                    format!("{v} is beyond the device kernels' 32-bit sizes"),
                ));
            }
        }
        debug_assert!(problem.num_levels < EXCLUDED as usize);
        debug_assert_eq!(positives.start.len(), problem.queries + 1);
        Ok(KernelProblem {
            problem,
            positives,
            pieces: encode_surrogates(sur)?,
        })
    }
}

/// The positives of `problem` when the kernels compute the smooth APs of `scores`
/// ([`applies`]), `None` when the streaming engine does.
pub(super) fn plan(scores: &Tensor, problem: &RankProblem) -> Option<Positives> {
    if crate::kernels::on_cuda(scores) {
        Positives::within_bound(problem)
    } else {
        None
    }
}

/// The per-query smooth APs (`Q`) and, when `need_grad`, their Jacobian (`Q × N`), computed by
/// the kernels on the scores' CUDA device, in the scores' dtype.
#[cfg(feature = "cuda")]
pub(super) fn run(
    scores: &Tensor,
    problem: &RankProblem,
    positives: Positives,
    sur: &PairSurrogates,
    need_grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (q, n) = scores.dims2()?;
    let op = cuda::SmoothRankOp {
        problem: KernelProblem::new(problem, positives, sur)?,
        need_grad,
    };
    // One buffer: the Jacobian's `Q × N` values (when asked), then the `Q` APs.
    let out = scores.detach().contiguous()?.apply_op1_no_bwd(&op)?;
    let jac_len = if need_grad { q * n } else { 0 };
    let values = out.narrow(0, jac_len, q)?;
    let jac = if need_grad {
        Some(out.narrow(0, 0, jac_len)?.reshape((q, n))?)
    } else {
        None
    };
    Ok((values, jac))
}

/// Whether `1 − mean AP` of the per-query APs `ap` is taken by the kernels
/// ([`crate::kernels::on_cuda`]): whichever engine computed them.
pub(super) fn mean_applies(ap: &Tensor) -> bool {
    crate::kernels::on_cuda(ap)
}

/// `1 − Σ_valid AP_q / n_valid` (Smooth-AP Eq. 7, HAPPIER's `1 − mH-AP`) of the `Q` APs `ap` on
/// the device, one op: one thread sums the valid queries' APs in order, and the backward pass
/// is one kernel (`−g / n_valid` for a valid query, 0 for the others), where candle's mask
/// upload, product, sum, division and their autograd took about ten launches.
#[cfg(feature = "cuda")]
pub(super) fn mean_loss(ap: &Tensor, valid: &[bool], n_valid: usize) -> Result<Tensor> {
    let q = ap.dim(0)?;
    let loss = cuda::MeanLoss {
        valid: valid.iter().map(|&v| u8::from(v)).collect(),
        n_valid: n_valid as f64,
    };
    Ok(crate::kernels::loss_op::apply(&ap.reshape((1, q))?, loss)?)
}

#[cfg(not(feature = "cuda"))]
pub(super) fn mean_loss(_: &Tensor, _: &[bool], _: usize) -> Result<Tensor> {
    Err(Error::invalid(
        "device",
        "the smooth-rank device kernels need a build with the `cuda` feature",
    ))
}

#[cfg(not(feature = "cuda"))]
pub(super) fn run(
    _: &Tensor,
    _: &RankProblem,
    _: Positives,
    _: &PairSurrogates,
    _: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    Err(Error::invalid(
        "device",
        "the smooth-rank device kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{KernelProblem, SOURCE};
    use crate::kernels::loss_op::KernelLoss;
    use crate::kernels::{
        check_matrix, dtype_error, instance, not_on_cpu, per_entry, per_row, ptx, view, Float,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Shape};
    use std::sync::Arc;

    /// The module's name in candle's cache of loaded modules.
    const MODULE: &str = "rankwise_smooth_rank";

    pub(super) struct SmoothRankOp<'a> {
        pub(super) problem: KernelProblem<'a>,
        pub(super) need_grad: bool,
    }

    impl SmoothRankOp<'_> {
        fn launch<T: Float>(
            &self,
            dev: &CudaDevice,
            scores: &CudaView<T>,
        ) -> candle_core::Result<CudaSlice<T>> {
            let (p, pos) = (self.problem.problem, &self.problem.positives);
            let (q, n, n_pos) = (p.queries, p.items, pos.item.len());
            let (nq, nn, nl, npos) = (q as u32, n as u32, p.num_levels as u32, n_pos as u32);
            let ptx = ptx(MODULE, SOURCE)?;
            let func = |name: &str| {
                let name = instance::<T>(&format!("rankwise_smooth_rank_{name}"));
                dev.get_or_load_custom_func(&name, MODULE, ptx)
            };
            // A list of no positive is uploaded as one unread value (no buffer of length 0).
            let upload = |v: &Vec<u32>| {
                if v.is_empty() {
                    dev.clone_htod(&vec![0u32])
                } else {
                    dev.clone_htod(v)
                }
            };
            let levels = dev.clone_htod(&p.levels)?;
            let rel = dev.clone_htod(&p.relevance)?;
            let pieces = dev.clone_htod(&self.problem.pieces)?;
            let pos_start = dev.clone_htod(&pos.start)?;
            let pos_query = upload(&pos.query)?;
            let pos_item = upload(&pos.item)?;
            // SAFETY (the four allocations, not zeroed: a launch each saved): pass 1 writes
            // every positive's rank, H-rank and G, pass 2 every value of the Jacobian, the
            // values kernel every query's AP (the emulation test fills them with NaN first).
            let mut rank = unsafe { dev.alloc::<f64>(n_pos.max(1))? };
            let mut hrank = unsafe { dev.alloc::<f64>(n_pos.max(1))? };
            let mut own = unsafe { dev.alloc::<f64>(n_pos.max(1))? };
            let jac_len = if self.need_grad { q * n } else { 0 };
            let mut out = unsafe { dev.alloc::<T>(jac_len + q)? };
            if n_pos > 0 {
                let pass1 = func("pass1")?;
                let mut b = pass1.builder();
                b.arg(scores)
                    .arg(&levels)
                    .arg(&rel)
                    .arg(&pieces)
                    .arg(&pos_query)
                    .arg(&pos_item)
                    .arg(&npos)
                    .arg(&nn)
                    .arg(&nl)
                    .arg(&mut rank)
                    .arg(&mut hrank)
                    .arg(&mut own);
                // SAFETY: the scores and levels hold `Q × N` values, the relevances
                // `Q × (L + 1)`, the pieces `6 × SLOT_LEN`, the lists and the three outputs one
                // value per positive, and the lists name queries below `Q` and items below `N`.
                unsafe { b.launch(per_row(n_pos)) }.w()?;
            }
            if self.need_grad {
                let pass2 = func("pass2")?;
                let mut jac = out.slice_mut(0..jac_len);
                let mut b = pass2.builder();
                b.arg(scores)
                    .arg(&levels)
                    .arg(&rel)
                    .arg(&pieces)
                    .arg(&pos_start)
                    .arg(&pos_item)
                    .arg(&nq)
                    .arg(&nn)
                    .arg(&nl)
                    .arg(&rank)
                    .arg(&hrank)
                    .arg(&own)
                    .arg(&mut jac);
                // SAFETY: as pass 1; `pos_start` holds `Q + 1` offsets into the lists, `jac`
                // `Q × N` values.
                unsafe { b.launch(per_entry(q, n)) }.w()?;
            }
            {
                let values_fn = func("values")?;
                let mut values = out.slice_mut(jac_len..);
                let mut b = values_fn.builder();
                b.arg(&levels)
                    .arg(&rel)
                    .arg(&pos_start)
                    .arg(&pos_item)
                    .arg(&nq)
                    .arg(&nn)
                    .arg(&nl)
                    .arg(&rank)
                    .arg(&hrank)
                    .arg(&mut values);
                // SAFETY: `values` holds `Q` values; the rest as pass 2.
                unsafe { b.launch(per_row(q)) }.w()?;
            }
            Ok(out)
        }
    }

    /// `1 − mean AP` over the valid queries of the `1 × Q` APs.
    pub(super) struct MeanLoss {
        pub(super) valid: Vec<u8>,
        pub(super) n_valid: f64,
    }

    impl KernelLoss for MeanLoss {
        /// The validity flags, on the device.
        type Saved = Arc<CudaSlice<u8>>;
        const NAME: &'static str = "rankwise-smooth-rank-mean";
        const GRAD_NAME: &'static str = "rankwise-smooth-rank-mean-grad";

        fn dims(&self, _: &Layout) -> (usize, usize) {
            (1, self.valid.len())
        }

        fn forward<T: Float>(
            &self,
            dev: &CudaDevice,
            ap: &CudaView<T>,
            (_, q): (usize, usize),
        ) -> candle_core::Result<(CudaSlice<T>, Self::Saved)> {
            let valid = dev.clone_htod(&self.valid)?;
            // SAFETY: the kernel writes the loss before anything reads it.
            let mut loss = unsafe { dev.alloc::<T>(1)? };
            let name = instance::<T>("rankwise_smooth_rank_mean");
            let f = dev.get_or_load_custom_func(&name, MODULE, ptx(MODULE, SOURCE)?)?;
            let nq = q as u32;
            let mut l = f.builder();
            l.arg(ap)
                .arg(&valid)
                .arg(&nq)
                .arg(&self.n_valid)
                .arg(&mut loss);
            // SAFETY: `ap` and `valid` hold `Q` values; one thread writes the loss.
            unsafe { l.launch(per_row(1)) }.w()?;
            Ok((loss, Arc::new(valid)))
        }

        fn backward<T: Float>(
            &self,
            dev: &CudaDevice,
            _: &CudaView<T>,
            g: &CudaView<T>,
            valid: &Self::Saved,
            (_, q): (usize, usize),
        ) -> candle_core::Result<CudaSlice<T>> {
            // SAFETY: the kernel writes every one of the `Q` values.
            let mut dap = unsafe { dev.alloc::<T>(q)? };
            let name = instance::<T>("rankwise_smooth_rank_mean_grad");
            let f = dev.get_or_load_custom_func(&name, MODULE, ptx(MODULE, SOURCE)?)?;
            let nq = q as u32;
            let mut l = f.builder();
            l.arg(valid.as_ref())
                .arg(g)
                .arg(&mut dap)
                .arg(&nq)
                .arg(&self.n_valid);
            // SAFETY: `valid` and `dap` hold `Q` values, `g` one.
            unsafe { l.launch(per_row(q)) }.w()?;
            Ok(dap)
        }
    }

    impl CustomOp1 for SmoothRankOp<'_> {
        fn name(&self) -> &'static str {
            "rankwise-smooth-rank"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
            Err(not_on_cpu(self.name()))
        }

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let p = self.problem.problem;
            check_matrix(self.name(), l, p.queries, p.items)?;
            let dev = s.device().clone();
            let len = if self.need_grad {
                p.queries * p.items
            } else {
                0
            } + p.queries;
            let storage = match s.dtype() {
                DType::F32 => CudaStorage::wrap_cuda_slice(
                    self.launch(&dev, &view::<f32>(s, l)?)?,
                    dev.clone(),
                ),
                DType::F64 => CudaStorage::wrap_cuda_slice(
                    self.launch(&dev, &view::<f64>(s, l)?)?,
                    dev.clone(),
                ),
                d => return Err(dtype_error(self.name(), d)),
            };
            Ok((storage, Shape::from(len)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hierarchy::Labels;
    use crate::losses::smooth_rank::{smooth_average_precision, Engine, QueryAp};
    use crate::losses::surrogate::{Heaviside, LowerStep, Sigmoid, Surrogate, UpperStep};
    use candle_core::DType;
    use candle_core::{Device, Var};

    /// Runs the kernels of `device.cu` on the host (the harness emulates the launch grid with a
    /// block of 7 threads, so partial blocks are exercised) and returns the APs and the
    /// Jacobian in `f64`.
    fn emulate(scores: &[f64], f32_scores: bool, kp: &KernelProblem) -> (Vec<f64>, Vec<f64>) {
        let (p, pos) = (kp.problem, &kp.positives);
        let mut input = Vec::new();
        for v in [
            p.queries,
            p.items,
            p.num_levels,
            usize::from(f32_scores),
            pos.item.len(),
        ] {
            input.extend((v as u32).to_le_bytes());
        }
        crate::kernels::emulation::push_values(&mut input, scores, f32_scores);
        input.extend(&p.levels);
        for v in pos.start.iter().chain(&pos.query).chain(&pos.item) {
            input.extend(v.to_le_bytes());
        }
        for v in p.relevance.iter().chain(&kp.pieces) {
            input.extend(v.to_le_bytes());
        }
        let v = crate::kernels::emulation::run("smooth_rank", &input);
        assert_eq!(v.len(), p.queries + p.queries * p.items);
        let (values, jac) = v.split_at(p.queries);
        (values.to_vec(), jac.to_vec())
    }

    /// The streaming engine's APs and Jacobian.
    fn streaming(
        scores: &[f64],
        q: usize,
        problem: &RankProblem,
        sur: &PairSurrogates,
    ) -> (Vec<f64>, Vec<f64>) {
        let n = scores.len() / q;
        let var = Var::from_vec(scores.to_vec(), (q, n), &Device::Cpu).unwrap();
        let ap = smooth_average_precision(var.as_tensor(), problem, sur, Engine::Streaming, None)
            .unwrap()
            .ap;
        let grads = ap.sum_all().unwrap().backward().unwrap();
        let jac = grads.get(var.as_tensor()).unwrap();
        (
            ap.to_vec1().unwrap(),
            jac.flatten_all().unwrap().to_vec1().unwrap(),
        )
    }

    fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}[{i}]: kernel {g} vs streaming {w}"
            );
        }
    }

    /// Scores on a grid of 0.004 with ties, so the exact step's convention at 0 and the
    /// sigmoid's clamp and the upper step's pieces are all visited.
    fn scores(q: usize, n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        (0..q * n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % 200) as f64 * 0.004 - 0.4
            })
            .collect()
    }

    fn check(name: &str, problem: &RankProblem, sur: &PairSurrogates, seed: u64) {
        let (q, n) = (problem.queries(), problem.items());
        let s = scores(q, n, seed);
        let kp = KernelProblem::new(problem, Positives::of(problem).unwrap(), sur).unwrap();
        let (want_v, want_j) = streaming(&s, q, problem, sur);
        let (v, j) = emulate(&s, false, &kp);
        assert_close(&format!("{name} f64 AP"), &v, &want_v, 1e-12);
        assert_close(&format!("{name} f64 Jacobian"), &j, &want_j, 1e-10);
        // f32 scores: the streaming engine on the f32-rounded scores against the kernels in f32
        // (whose exponential is then in f32).
        let s32: Vec<f64> = s.iter().map(|&x| x as f32 as f64).collect();
        let (want_v, want_j) = streaming(&s32, q, problem, sur);
        let (v, j) = emulate(&s32, true, &kp);
        assert_close(&format!("{name} f32 AP"), &v, &want_v, 1e-5);
        assert_close(&format!("{name} f32 Jacobian"), &j, &want_j, 1e-4);
    }

    fn labels(classes: &[&[i64]]) -> Labels {
        let rows: Vec<Vec<i64>> = (0..classes[0].len())
            .map(|i| classes.iter().map(|c| c[i]).collect())
            .collect();
        Labels::new(rows).unwrap()
    }

    #[test]
    fn the_kernels_equal_the_streaming_engine_for_every_surrogate_family() {
        let fine: Vec<i64> = (0..23).map(|i| i % 5).collect();
        let coarse: Vec<i64> = fine.iter().map(|c| c / 2).collect();
        let binary = labels(&[&fine]);
        let hier = labels(&[&fine, &coarse]);
        let sigmoid = PairSurrogates::uniform(Surrogate::Sigmoid(Sigmoid { tau: 0.01 }));
        let exact = PairSurrogates::uniform(Surrogate::Heaviside(Heaviside::default()));
        // ROADMAP / HAPPIER: the upper step on lower pairs, the lower step on higher pairs,
        // with the authors' discontinuous SOP offset.
        let mixed = PairSurrogates {
            rank: [
                Surrogate::UpperStep(UpperStep::sop_code()),
                Surrogate::Sigmoid(Sigmoid { tau: 0.01 }),
                Surrogate::LowerStep(LowerStep::default()),
            ],
            hrank: [
                Surrogate::Sigmoid(Sigmoid { tau: 0.05 }),
                Surrogate::Sigmoid(Sigmoid { tau: 0.01 }),
                Surrogate::LowerStep(LowerStep::default()),
            ],
        };
        for include_self in [false, true] {
            let p = RankProblem::binary(&binary, include_self).unwrap();
            check("Smooth-AP", &p, &sigmoid, 1);
            check("exact AP", &p, &exact, 2);
            check("mixed, binary", &p, &mixed, 3);
        }
        for include_self in [false, true] {
            let rel = crate::hierarchy::Relevance::default();
            let p = RankProblem::hierarchical(&hier, include_self, &rel).unwrap();
            check("H-AP", &p, &mixed, 4);
            check("H-AP, sigmoid", &p, &sigmoid, 5);
        }
    }

    #[test]
    fn a_query_without_positive_gets_zero_and_a_zero_row() {
        // Three singleton classes and a pair: the singletons have no positive.
        let l = labels(&[&[0, 1, 2, 3, 3]]);
        let p = RankProblem::binary(&l, false).unwrap();
        let sur = PairSurrogates::uniform(Surrogate::Sigmoid(Sigmoid { tau: 0.01 }));
        let kp = KernelProblem::new(&p, Positives::of(&p).unwrap(), &sur).unwrap();
        let s = scores(5, 5, 9);
        let (v, j) = emulate(&s, false, &kp);
        for q in 0..3 {
            assert_eq!(v[q], 0.0);
            assert!(j[q * 5..(q + 1) * 5].iter().all(|&x| x == 0.0));
        }
        assert!(v[3] > 0.0 && v[4] > 0.0);
        // No query with a positive: no pass 1 launch, every AP 0 and every row 0.
        let p = RankProblem::binary(&labels(&[&[0, 1, 2, 3]]), false).unwrap();
        let kp = KernelProblem::new(&p, Positives::of(&p).unwrap(), &sur).unwrap();
        assert!(kp.positives.item.is_empty());
        let (v, j) = emulate(&scores(4, 4, 10), false, &kp);
        assert!(v.iter().chain(&j).all(|&x| x == 0.0));
    }

    #[test]
    fn surrogates_are_encoded_piece_by_piece() {
        let sur = PairSurrogates::uniform(Surrogate::UpperStep(UpperStep::default()));
        let enc = encode_surrogates(&sur).unwrap();
        assert_eq!(enc.len(), 6 * SLOT_LEN);
        let pieces = Surrogate::UpperStep(UpperStep::default()).pieces();
        assert_eq!(enc[0], pieces.len() as f64);
        // The last piece is the unbounded linear branch ρ (t − δ) + offset.
        let last = &enc[1 + (pieces.len() - 1) * PIECE_LEN..1 + pieces.len() * PIECE_LEN];
        let u = UpperStep::default();
        assert_eq!(last, &[2.0, 0.0, 1.0, u.rho, u.delta, u.effective_offset()]);
    }

    /// The mean-loss kernels run on the host by the harness: the loss and `g ∂L/∂AP`.
    fn emulate_mean(ap: &[f64], f32_ap: bool, valid: &[bool], g: f64) -> (f64, Vec<f64>) {
        let q = ap.len();
        let n_valid = valid.iter().filter(|v| **v).count();
        let mut input = Vec::new();
        for v in [q as u32, u32::from(f32_ap)] {
            input.extend(v.to_le_bytes());
        }
        input.extend((n_valid as f64).to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, ap, f32_ap);
        input.extend(valid.iter().map(|&v| u8::from(v)));
        crate::kernels::emulation::push_values(&mut input, &[g], f32_ap);
        let out = crate::kernels::emulation::run("smooth_rank_mean", &input);
        assert_eq!(out.len(), 1 + q);
        (out[0], out[1..].to_vec())
    }

    #[test]
    fn the_mean_loss_kernels_equal_the_tensor_formulation() {
        let q = 11;
        let ap: Vec<f64> = crate::kernels::emulation::uniform(q, 4)
            .into_iter()
            .map(|v| v + 0.5)
            .collect();
        let valid: Vec<bool> = (0..q).map(|i| i % 4 != 1).collect();
        for (dtype, tol) in [(DType::F64, 1e-15), (DType::F32, 1e-7)] {
            let var = Var::from_tensor(
                &Tensor::from_vec(ap.clone(), q, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
            let loss = QueryAp {
                ap: var.as_tensor().clone(),
                valid: valid.clone(),
            }
            .mean_loss()
            .unwrap();
            let want = loss
                .to_dtype(DType::F64)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            let grads = loss.backward().unwrap();
            let want_grad: Vec<f64> = grads
                .get(&var)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1()
                .unwrap();
            for g in [1.0, -2.5] {
                let (got, dap) = emulate_mean(&ap, dtype == DType::F32, &valid, g);
                assert!((got - want).abs() <= tol, "{dtype:?}: {got} vs {want}");
                for (i, (d, w)) in dap.iter().zip(&want_grad).enumerate() {
                    assert!(
                        (d - g * w).abs() <= tol,
                        "{dtype:?} g={g} [{i}]: {d} vs {}",
                        g * w
                    );
                }
                assert!(dap.iter().zip(&valid).all(|(d, v)| *v || *d == 0.0));
            }
        }
    }

    #[test]
    fn the_kernels_apply_only_on_a_cuda_device() {
        let s = Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(!mean_applies(
            &Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap()
        ));
        let p = RankProblem::binary(&labels(&[&[0, 0, 1, 1]]), false).unwrap();
        assert!(!applies(&s, &p));
        assert_eq!(plan(&s, &p), None);
    }

    #[test]
    fn the_positive_lists_hold_every_positive_of_every_query_in_order() {
        // Two levels: fine classes {0, 1}, {2}, {3, 4, 5}; coarse {0, 1, 2}, {3, 4, 5}. Query 2
        // has coarse positives only; with the query left out, the self pair is excluded.
        let hier = labels(&[&[0, 0, 1, 2, 2, 2], &[0, 0, 0, 1, 1, 1]]);
        let singletons = labels(&[&[0, 1, 2, 3, 3]]);
        let rel = crate::hierarchy::Relevance::default();
        for p in [
            RankProblem::hierarchical(&hier, false, &rel).unwrap(),
            RankProblem::hierarchical(&hier, true, &rel).unwrap(),
            RankProblem::binary(&singletons, false).unwrap(),
        ] {
            let pos = Positives::of(&p).unwrap();
            assert_eq!(pos.start.len(), p.queries + 1);
            assert_eq!(pos.item.len(), p.positive_pairs);
            assert_eq!(pos.query.len(), pos.item.len());
            for q in 0..p.queries {
                let want: Vec<u32> = (0..p.items as u32)
                    .filter(|&j| {
                        let l = p.levels_row(q)[j as usize];
                        l != EXCLUDED && l >= 1
                    })
                    .collect();
                let entries = pos.start[q] as usize..pos.start[q + 1] as usize;
                assert_eq!(pos.item[entries.clone()], want[..], "query {q}");
                assert!(pos.query[entries].iter().all(|&e| e == q as u32));
            }
        }
        // Query 0 of the hierarchy without itself: its fine twin and the coarse item 2.
        let p = RankProblem::hierarchical(&hier, false, &rel).unwrap();
        let pos = Positives::of(&p).unwrap();
        assert_eq!(pos.item[..pos.start[1] as usize], [1, 2]);
        // The singletons' queries 0..3 have none.
        let p = RankProblem::binary(&singletons, false).unwrap();
        assert_eq!(Positives::of(&p).unwrap().start, [0, 0, 0, 0, 1, 2]);
    }

    #[test]
    fn the_kernels_take_a_problem_whose_positives_times_items_is_within_the_bound() {
        // 6 items, 3 pairs: every query has one positive (itself left out), so the work is
        // 6 positives × 6 items = 36, where a thread per item scanning every item was 216.
        let p = RankProblem::binary(&labels(&[&[0, 0, 1, 1, 2, 2]]), false).unwrap();
        assert!(Positives::within(&p, 36).is_some());
        assert_eq!(Positives::within(&p, 35), None);
        assert_eq!(Positives::within(&p, 36), Positives::of(&p));
    }
}

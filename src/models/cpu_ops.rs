//! CPU kernels with hand-written backward passes for the two layers whose candle autograd is
//! slow: training-mode batch normalisation and max pooling.
//!
//! Through candle's generic ops, a training-mode BatchNorm costs about ten full passes over the
//! activations (transposes, broadcasts and their gradients) and a max pooling a stacked copy of
//! its windows plus a gather and a scatter; on the small CNN the two took about 30 % of a
//! training step. Here each is one custom op with the textbook gradient, parallel over
//! channel planes with rayon:
//!
//! * batch norm (Ioffe & Szegedy, 2015, Alg. 1 and its backward):
//!   `x̂ = (x − μ_B)/√(σ²_B + ε)`, `y = γx̂ + β`;
//!   `∂β = Σ∂y`, `∂γ = Σ∂y·x̂`, `∂x = γ/√(σ²_B + ε) · (∂y − ∂β/m − x̂·∂γ/m)`, with `m` values per
//!   channel and the biased variance `σ²_B`, optionally followed by a ReLU in the same op (its
//!   mask applied to `∂y`); sums are accumulated in `f64` (interleaved partial sums, so they
//!   vectorise), per-value arithmetic is in the tensor's type with per-channel coefficients
//!   (`y = x·a + b`, PyTorch's CPU form);
//! * max pooling: the gradient of each output goes to the first maximum of its window in
//!   row-major order (PyTorch's choice), out-of-image positions acting as −∞.
//!
//! The generic tensor-op versions in [`super::layers`] remain the reference (tests compare the
//! two) and the path on other devices.

use crate::cpu::host_sums::vectorised;
use crate::cpu::{slice, with_values};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// Per-channel batch statistics: mean and `1/√(σ² + ε)`, and the biased variance.
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchStats {
    pub mean: Vec<f64>,
    pub var: Vec<f64>,
    pub inv_std: Vec<f64>,
}

/// Training-mode batch norm of a contiguous `B × C × H × W` CPU tensor with `gamma`, `beta`
/// (`C`), followed by a ReLU when `relu`; returns the output and the batch statistics (for the
/// running averages).
///
/// With the ReLU fused, one op replaces three (batch norm, ReLU, and the ReLU's backward
/// comparison, cast and product): the gradient is masked where the output is 0, as PyTorch's
/// `threshold_backward` (`y > 0`; candle's own ReLU passes the gradient at exactly 0 too).
pub(crate) fn batch_norm_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
    relu: bool,
) -> candle_core::Result<(Tensor, BatchStats)> {
    let stats = Arc::new(Mutex::new(BatchStats::default()));
    let op = BatchNormOp {
        eps,
        relu,
        stats: stats.clone(),
    };
    let y = x.contiguous()?.apply_op3(gamma, beta, op)?;
    let s = stats.lock().expect("batch-norm statistics lock").clone();
    Ok((y, s))
}

struct BatchNormOp {
    eps: f64,
    relu: bool,
    stats: Arc<Mutex<BatchStats>>,
}

/// Accumulators per sum: the values are added in [`LANES`] interleaved `f64` partial sums,
/// combined in a fixed order at the end. One sequential sum was a chain of dependent additions
/// (one per value, ~4 cycles each) that the compiler may not reorder; interleaved, the loop
/// vectorises. The order is fixed, so the result does not depend on the threads.
const LANES: usize = 8;

/// The batch norm's gradient sums over one plane, `(Σ∂y, Σ∂y·x̂)` in `f64` in [`LANES`]
/// interleaved partial sums, with `∂y` zero where the fused ReLU cut the output
/// ([`Reaching`]).
///
/// Written out per value instead of through a closure returning a pair: the closure form
/// compiled to scalar, branching code (22 % of a small-CNN training step, perf, AMD EPYC
/// 2-core VM, 2026-11-27); this form vectorises, and [`vectorised`] runs it at the CPU's
/// widest width. Same additions in the same order: the sums are bit-identical.
#[inline(always)]
fn grad_sums<T: WithDType, const RELU: bool>(x: &[T], g: &[T], r: Reaching<T>) -> (f64, f64) {
    let (mut a, mut b) = ([0.0f64; LANES], [0.0f64; LANES]);
    let (xc, gc) = (x.chunks_exact(LANES), g.chunks_exact(LANES));
    let (xr, gr) = (xc.remainder(), gc.remainder());
    for (xs, gs) in xc.zip(gc) {
        for l in 0..LANES {
            let (g, xhat) = r.at::<RELU>(xs[l], gs[l]);
            a[l] += g.to_f64();
            b[l] += (g * xhat).to_f64();
        }
    }
    let (mut sa, mut sb) = (a.iter().sum::<f64>(), b.iter().sum::<f64>());
    for (&xv, &gv) in xr.iter().zip(gr) {
        let (g, xhat) = r.at::<RELU>(xv, gv);
        sa += g.to_f64();
        sb += (g * xhat).to_f64();
    }
    (sa, sb)
}

/// Per channel, in `T`: the forward affine map (`scale`, `shift`, to recompute where the ReLU
/// cut) and `x̂ = x·inv + off`.
#[derive(Clone, Copy)]
struct Reaching<T> {
    scale: T,
    shift: T,
    inv: T,
    off: T,
}

impl<T: WithDType> Reaching<T> {
    fn of(ch: usize, stats: &BatchStats, gamma: &[T], beta: &[T]) -> Self {
        let (scale, shift) = affine(ch, &stats.mean, &stats.inv_std, gamma, beta);
        Self {
            scale,
            shift,
            inv: T::from_f64(stats.inv_std[ch]),
            off: T::from_f64(-stats.mean[ch] * stats.inv_std[ch]),
        }
    }

    /// `(∂y, x̂)` of one value: the gradient reaching the batch norm, zero where the ReLU cut
    /// the output (recomputed exactly as the forward pass did). A select, not a branch: the
    /// cut is a coin flip per value, and mispredicted branches made this pass 8 ns a value.
    #[inline(always)]
    fn at<const RELU: bool>(self, x: T, g: T) -> (T, T) {
        let cut = RELU && x * self.scale + self.shift <= T::zero();
        (if cut { T::zero() } else { g }, x * self.inv + self.off)
    }
}

/// `Σ f(x)` over `x`, in `f64`, in [`LANES`] interleaved partial sums.
#[inline(always)]
fn sum1<T: WithDType>(x: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut a = [0.0f64; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for xs in chunks {
        for l in 0..LANES {
            a[l] += f(xs[l].to_f64());
        }
    }
    let mut s = a.iter().sum::<f64>();
    for v in rest {
        s += f(v.to_f64());
    }
    s
}

/// `γ/√(σ² + ε)` and `β − μ·γ/√(σ² + ε)` of channel `ch` (computed in `f64`, rounded once):
/// the batch norm of a value is then one multiply-add in `T`, the per-value passes vectorise
/// in `T`'s own width.
fn affine<T: WithDType>(
    ch: usize,
    mean: &[f64],
    inv_std: &[f64],
    gamma: &[T],
    beta: &[T],
) -> (T, T) {
    let a = gamma[ch].to_f64() * inv_std[ch];
    (
        T::from_f64(a),
        T::from_f64(beta[ch].to_f64() - mean[ch] * a),
    )
}

/// The batch norm of `x` (`B × C × H·W` values, `dims`), plus `residual` when given (same
/// shape, added after the affine map), then the ReLU when `relu`.
fn bn_forward<T: WithDType>(
    x: &[T],
    gamma: &[T],
    beta: &[T],
    dims: (usize, usize, usize),
    eps: f64,
    relu: bool,
    residual: Option<&[T]>,
) -> (Vec<T>, BatchStats) {
    let (b, c, hw) = dims;
    let m = (b * hw) as f64;
    let plane = |n: usize, ch: usize| &x[(n * c + ch) * hw..(n * c + ch + 1) * hw];
    let (mean, var): (Vec<f64>, Vec<f64>) = (0..c)
        .into_par_iter()
        .map(|ch| {
            let sum: f64 = (0..b).map(|n| sum1(plane(n, ch), |v| v)).sum();
            let mean = sum / m;
            let sq: f64 = (0..b)
                .map(|n| sum1(plane(n, ch), |v| (v - mean) * (v - mean)))
                .sum();
            (mean, sq / m)
        })
        .unzip();
    let inv_std: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let mut y = vec![T::zero(); x.len()];
    y.par_chunks_mut(hw).enumerate().for_each(|(p, out)| {
        let ch = p % c;
        let (scale, shift) = affine(ch, &mean, &inv_std, gamma, beta);
        let plane = p * hw..(p + 1) * hw;
        // Not `max`: a NaN stays NaN (as in PyTorch), so a diverged run shows.
        let cut = |y: T| if relu && y < T::zero() { T::zero() } else { y };
        match residual {
            // The sum rounded as the separate ops round it: the affine map, then the addition.
            Some(r) => {
                for ((o, &v), &r) in out.iter_mut().zip(&x[plane.clone()]).zip(&r[plane]) {
                    *o = cut((v * scale + shift) + r);
                }
            }
            None => {
                for (o, &v) in out.iter_mut().zip(&x[plane]) {
                    *o = cut(v * scale + shift);
                }
            }
        }
    });
    (y, BatchStats { mean, var, inv_std })
}

impl CustomOp3 for BatchNormOp {
    fn name(&self) -> &'static str {
        "rankwise-batch-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, c, h, w) = l1.shape().dims4()?;
        let dims = (b, c, h * w);
        let (out, stats) = match s1 {
            CpuStorage::F32(_) => {
                let (y, s) = bn_forward::<f32>(
                    slice(s1, l1)?,
                    slice(s2, l2)?,
                    slice(s3, l3)?,
                    dims,
                    self.eps,
                    self.relu,
                    None,
                );
                (CpuStorage::F32(y), s)
            }
            CpuStorage::F64(_) => {
                let (y, s) = bn_forward::<f64>(
                    slice(s1, l1)?,
                    slice(s2, l2)?,
                    slice(s3, l3)?,
                    dims,
                    self.eps,
                    self.relu,
                    None,
                );
                (CpuStorage::F64(y), s)
            }
            other => {
                candle_core::bail!("rankwise batch norm: unsupported dtype {:?}", other.dtype())
            }
        };
        *self.stats.lock().expect("batch-norm statistics lock") = stats;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let stats = self
            .stats
            .lock()
            .expect("batch-norm statistics lock")
            .clone();
        let (grad_x, d_gamma, d_beta) = match x.dtype() {
            candle_core::DType::F32 => self.backward::<f32>(x, gamma, beta, grad, &stats)?,
            candle_core::DType::F64 => self.backward::<f64>(x, gamma, beta, grad, &stats)?,
            other => candle_core::bail!("rankwise batch norm: unsupported dtype {other:?}"),
        };
        let (c, dtype, dev) = (gamma.elem_count(), x.dtype(), x.device());
        let to_tensor = |v: Vec<f64>| -> candle_core::Result<Tensor> {
            Tensor::from_vec(v, c, dev)?.to_dtype(dtype)
        };
        let grad_gamma = if gamma.track_op() {
            Some(to_tensor(d_gamma)?)
        } else {
            None
        };
        let grad_beta = if beta.track_op() {
            Some(to_tensor(d_beta)?)
        } else {
            None
        };
        Ok((grad_x, grad_gamma, grad_beta))
    }
}

impl BatchNormOp {
    /// `(∂x, ∂γ, ∂β)`, the sums accumulated in `f64` straight from the `T` values.
    fn backward<T: WithDType>(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        grad: &Tensor,
        stats: &BatchStats,
    ) -> candle_core::Result<(Option<Tensor>, Vec<f64>, Vec<f64>)> {
        let gam: Vec<T> = gamma.to_vec1()?;
        let bet: Vec<T> = beta.to_vec1()?;
        bn_backward(x, &gam, &bet, grad, stats, self.relu)
    }
}

/// The batch norm's backward pass: `(∂x, ∂γ, ∂β)` from the output gradient `grad` (cut where
/// the fused ReLU cut the output when `relu`), `∂x` only when `x` tracks a gradient; the sums
/// accumulated in `f64` straight from the `T` values.
fn bn_backward<T: WithDType>(
    x: &Tensor,
    gam: &[T],
    bet: &[T],
    grad: &Tensor,
    stats: &BatchStats,
    relu: bool,
) -> candle_core::Result<(Option<Tensor>, Vec<f64>, Vec<f64>)> {
    let (b, c, h, w) = x.dims4()?;
    let hw = h * w;
    let m = (b * hw) as f64;
    with_values::<T, _>(x, |xs| {
        with_values::<T, _>(grad, |gs| {
            let plane = |p: usize| p * hw..(p + 1) * hw;
            // ∂β and ∂γ per channel, summed in f64.
            let (d_beta, d_gamma): (Vec<f64>, Vec<f64>) = (0..c)
                .into_par_iter()
                .map(|ch| {
                    let r = Reaching::of(ch, stats, gam, bet);
                    (0..b)
                        .map(|n| {
                            let p = plane(n * c + ch);
                            let (x, g) = (&xs[p.clone()], &gs[p]);
                            vectorised(
                                #[inline(always)]
                                || match relu {
                                    true => grad_sums::<T, true>(x, g, r),
                                    false => grad_sums::<T, false>(x, g, r),
                                },
                            )
                        })
                        .fold((0.0, 0.0), |(a, b), (u, v)| (a + u, b + v))
                })
                .unzip();
            let grad_x = if x.track_op() {
                let mut dx = vec![T::zero(); xs.len()];
                dx.par_chunks_mut(hw).enumerate().for_each(|(p, out)| {
                    let ch = p % c;
                    let r = Reaching::of(ch, stats, gam, bet);
                    let scale = T::from_f64(gam[ch].to_f64() * stats.inv_std[ch]);
                    let (mb, mg) = (T::from_f64(d_beta[ch] / m), T::from_f64(d_gamma[ch] / m));
                    let p = plane(p);
                    for ((o, &x), &g) in out.iter_mut().zip(&xs[p.clone()]).zip(&gs[p]) {
                        let (g, xhat) = if relu {
                            r.at::<true>(x, g)
                        } else {
                            r.at::<false>(x, g)
                        };
                        *o = scale * (g - mb - xhat * mg);
                    }
                });
                Some(Tensor::from_vec(dx, x.shape(), x.device())?)
            } else {
                None
            };
            Ok((grad_x, d_gamma, d_beta))
        })
    })
}

/// `relu(batch_norm(x) + residual)` in training mode, one op (a ResNet block's end: the second
/// batch norm, the shortcut's addition and the ReLU): returns the output and the batch
/// statistics. `x`, `residual`: `B × C × H × W` on the CPU; `gamma`, `beta`: `C`.
///
/// Why: as three ops, the addition and the ReLU each made a pass forward and several backward
/// (the ReLU's mask, its cast, the product), and candle's backward pass added each of their
/// gradients into a fresh zero tensor — about 20 % of a ResNet-18 training step (perf, AMD
/// EPYC 2-core VM, benches/train_throughput_vs_torch.md). Here the backward pass cuts the
/// gradient once where the output is 0 (`y > 0`, PyTorch's `threshold_backward`), hands that to
/// the residual as it is, and runs the batch norm's backward on it. candle's custom ops take
/// three inputs, so γ and β travel as one `2C` tensor (`[γ, β]`; its gradient is split back by
/// the concatenation's backward).
pub(crate) fn batch_norm_add_relu_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    residual: &Tensor,
    eps: f64,
) -> candle_core::Result<(Tensor, BatchStats)> {
    let stats = Arc::new(Mutex::new(BatchStats::default()));
    let op = BatchNormAddReluOp {
        eps,
        stats: stats.clone(),
    };
    let affine = Tensor::cat(&[gamma, beta], 0)?;
    let y = x
        .contiguous()?
        .apply_op3(&affine, &residual.contiguous()?, op)?;
    let s = stats.lock().expect("batch-norm statistics lock").clone();
    Ok((y, s))
}

struct BatchNormAddReluOp {
    eps: f64,
    stats: Arc<Mutex<BatchStats>>,
}

impl CustomOp3 for BatchNormAddReluOp {
    fn name(&self) -> &'static str {
        "rankwise-batch-norm-add-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, c, h, w) = l1.shape().dims4()?;
        if l3.shape() != l1.shape() || l2.shape().elem_count() != 2 * c {
            candle_core::bail!(
                "rankwise batch norm + residual: x {:?}, [γ, β] {:?}, residual {:?}",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let dims = (b, c, h * w);
        // (storage, layout) of x, [γ, β] and the residual.
        type Input<'a> = (&'a CpuStorage, &'a Layout);
        fn run<T: WithDType>(
            [x, affine, residual]: [Input<'_>; 3],
            dims: (usize, usize, usize),
            eps: f64,
        ) -> candle_core::Result<(Vec<T>, BatchStats)> {
            let affine: &[T] = slice(affine.0, affine.1)?;
            let (gamma, beta) = affine.split_at(dims.1);
            Ok(bn_forward::<T>(
                slice(x.0, x.1)?,
                gamma,
                beta,
                dims,
                eps,
                true,
                Some(slice(residual.0, residual.1)?),
            ))
        }
        let inputs = [(s1, l1), (s2, l2), (s3, l3)];
        let (out, stats) = match s1 {
            CpuStorage::F32(_) => {
                let (y, s) = run::<f32>(inputs, dims, self.eps)?;
                (CpuStorage::F32(y), s)
            }
            CpuStorage::F64(_) => {
                let (y, s) = run::<f64>(inputs, dims, self.eps)?;
                (CpuStorage::F64(y), s)
            }
            other => candle_core::bail!(
                "rankwise batch norm + residual: unsupported dtype {:?}",
                other.dtype()
            ),
        };
        *self.stats.lock().expect("batch-norm statistics lock") = stats;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        affine: &Tensor,
        residual: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let stats = self
            .stats
            .lock()
            .expect("batch-norm statistics lock")
            .clone();
        let c = affine.elem_count() / 2;
        fn grads<T: WithDType>(
            x: &Tensor,
            affine: &Tensor,
            c: usize,
            g: &Tensor,
            stats: &BatchStats,
        ) -> candle_core::Result<(Option<Tensor>, Vec<f64>, Vec<f64>)> {
            let ab: Vec<T> = affine.to_vec1()?;
            let (gam, bet) = ab.split_at(c);
            bn_backward(x, gam, bet, g, stats, false)
        }
        let g = relu_grad(res, grad)?;
        let (grad_x, d_gamma, d_beta) = match x.dtype() {
            candle_core::DType::F32 => grads::<f32>(x, affine, c, &g, &stats)?,
            candle_core::DType::F64 => grads::<f64>(x, affine, c, &g, &stats)?,
            other => {
                candle_core::bail!("rankwise batch norm + residual: unsupported dtype {other:?}")
            }
        };
        let grad_affine = if affine.track_op() {
            let both: Vec<f64> = d_gamma.into_iter().chain(d_beta).collect();
            Some(Tensor::from_vec(both, 2 * c, x.device())?.to_dtype(x.dtype())?)
        } else {
            None
        };
        let grad_residual = residual.track_op().then_some(g);
        Ok((grad_x, grad_affine, grad_residual))
    }
}

/// The gradient through a ReLU, from its output `y`: `grad` where `y > 0`, else 0 (a select,
/// PyTorch's `threshold_backward`), in one parallel pass over a CPU tensor.
fn relu_grad(y: &Tensor, grad: &Tensor) -> candle_core::Result<Tensor> {
    fn cut<T: WithDType>(y: &Tensor, grad: &Tensor) -> candle_core::Result<Tensor> {
        let g = with_values::<T, _>(y, |ys| {
            with_values::<T, _>(grad, |gs| {
                let mut out = vec![T::zero(); gs.len()];
                out.par_chunks_mut(1 << 14).enumerate().for_each(|(i, o)| {
                    let at = i << 14;
                    for ((o, &y), &g) in o.iter_mut().zip(&ys[at..]).zip(&gs[at..]) {
                        *o = if y > T::zero() { g } else { T::zero() };
                    }
                });
                Ok(out)
            })
        })?;
        Tensor::from_vec(g, grad.shape(), grad.device())
    }
    match grad.dtype() {
        candle_core::DType::F32 => cut::<f32>(y, grad),
        candle_core::DType::F64 => cut::<f64>(y, grad),
        other => candle_core::bail!("rankwise ReLU gradient: unsupported dtype {other:?}"),
    }
}

/// `x·a + b` per channel of a contiguous `B × C × H × W` CPU tensor (`a`, `b`: `C`), then the
/// ReLU when `relu`: a batch norm with fixed statistics (evaluation, embedding) in one pass.
///
/// Why: as candle ops it was a broadcast product, a broadcast sum and a ReLU, three passes over
/// the activations, each on one thread on the machines where element-wise ops are kept off
/// candle's second pool (`cpu::threads`); the evaluation passes of every training run and
/// `rankwise embed` pay it at every layer. The value rounds as those ops do (the product, then
/// the sum, in `T`), so outputs are bit-identical. The backward pass, rarely wanted (a network
/// trained through evaluation-mode batch norms), is written with candle ops: `∂x = g·a`,
/// `∂a = Σ g·x`, `∂b = Σ g` over the batch and the positions, `g` cut where the output is 0
/// ([`relu_grad`], as the fused training op cuts it).
pub(crate) fn channel_affine(
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    relu: bool,
) -> candle_core::Result<Tensor> {
    x.contiguous()?
        .apply_op3(&a.contiguous()?, &b.contiguous()?, ChannelAffineOp { relu })
}

struct ChannelAffineOp {
    relu: bool,
}

impl CustomOp3 for ChannelAffineOp {
    fn name(&self) -> &'static str {
        "rankwise-channel-affine"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, c, h, w) = l1.shape().dims4()?;
        if l2.shape().elem_count() != c || l3.shape().elem_count() != c {
            candle_core::bail!(
                "rankwise channel affine: x {:?} with a {:?} and b {:?}",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let hw = h * w;
        let relu = self.relu;
        fn run<T: WithDType>(x: &[T], a: &[T], b: &[T], hw: usize, relu: bool) -> Vec<T> {
            let c = a.len();
            let mut y = vec![T::zero(); x.len()];
            y.par_chunks_mut(hw).enumerate().for_each(|(p, out)| {
                let (a, b) = (a[p % c], b[p % c]);
                for (o, &v) in out.iter_mut().zip(&x[p * hw..(p + 1) * hw]) {
                    let y = v * a + b;
                    *o = if relu && y < T::zero() { T::zero() } else { y };
                }
            });
            y
        }
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(run::<f32>(
                slice(s1, l1)?,
                slice(s2, l2)?,
                slice(s3, l3)?,
                hw,
                relu,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(run::<f64>(
                slice(s1, l1)?,
                slice(s2, l2)?,
                slice(s3, l3)?,
                hw,
                relu,
            )),
            other => candle_core::bail!(
                "rankwise channel affine: unsupported dtype {:?}",
                other.dtype()
            ),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = if self.relu {
            relu_grad(res, grad)?
        } else {
            grad.clone()
        };
        let c = a.elem_count();
        let per_channel = |t: &Tensor| -> candle_core::Result<Tensor> {
            t.transpose(0, 1)?.contiguous()?.reshape((c, ()))?.sum(1)
        };
        let dx = g.broadcast_mul(&a.reshape((1, c, 1, 1))?)?;
        let da = per_channel(&(&g * x)?)?;
        let db = per_channel(&g)?;
        Ok((Some(dx), Some(da), Some(db)))
    }
}

/// Max pooling of a `B × C × H × W` CPU tensor (`kernel`, `stride`, `padding`), output
/// `B × C × H' × W'` with `H' = (H + 2p − k)/s + 1`.
pub(crate) fn max_pool2d(
    x: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> candle_core::Result<Tensor> {
    let op = MaxPoolOp {
        kernel,
        stride,
        padding,
        argmax: Arc::new(Mutex::new(Vec::new())),
    };
    x.contiguous()?.apply_op1(op)
}

struct MaxPoolOp {
    kernel: usize,
    stride: usize,
    padding: usize,
    /// Index inside its plane of the input chosen by each output (set by the forward pass).
    argmax: Arc<Mutex<Vec<u32>>>,
}

impl MaxPoolOp {
    fn out_size(&self, n: usize) -> usize {
        (n + 2 * self.padding - self.kernel) / self.stride + 1
    }

    /// The input rows (or columns) `lo..hi` that output row `o` reads, clipped to `0..size`.
    fn window(&self, o: usize, size: usize) -> (usize, usize) {
        let start = o * self.stride;
        (
            start.saturating_sub(self.padding),
            (start + self.kernel - self.padding).min(size),
        )
    }

    fn forward<T: WithDType>(
        &self,
        x: &[T],
        b: usize,
        c: usize,
        h: usize,
        w: usize,
    ) -> (Vec<T>, Vec<u32>) {
        let (ho, wo) = (self.out_size(h), self.out_size(w));
        let mut y = vec![T::zero(); b * c * ho * wo];
        let mut idx = vec![0u32; b * c * ho * wo];
        y.par_chunks_mut(ho * wo)
            .zip(idx.par_chunks_mut(ho * wo))
            .enumerate()
            .for_each(|(p, (out, arg))| {
                let plane = &x[p * h * w..(p + 1) * h * w];
                if (self.kernel, self.stride, self.padding) == (2, 2, 0) {
                    return pool_2x2(plane, w, wo, out, arg);
                }
                for oy in 0..ho {
                    // The window clipped to the image (the padding, −∞, never wins); it is never
                    // empty since padding < kernel.
                    let (y0, y1) = self.window(oy, h);
                    for ox in 0..wo {
                        let (x0, x1) = self.window(ox, w);
                        let mut k = y0 * w + x0;
                        let mut v = plane[k];
                        for iy in y0..y1 {
                            for (ix, &u) in plane[iy * w + x0..iy * w + x1].iter().enumerate() {
                                // Strictly greater: ties keep the first maximum.
                                if u > v {
                                    v = u;
                                    k = iy * w + x0 + ix;
                                }
                            }
                        }
                        out[oy * wo + ox] = v;
                        arg[oy * wo + ox] = k as u32;
                    }
                }
            });
        (y, idx)
    }
}

/// [`MaxPoolOp::forward`] of one plane for 2 × 2 windows, stride 2, no padding (the small
/// CNN's pooling): the four values of each window compared in row-major order with selects.
/// The general loop spent most of its time on the bounds of two-value rows (13 % of a
/// small-CNN training step, perf, AMD EPYC 2-core VM, 2026-11-27). Same comparisons in the
/// same order as the general loop, so the same maxima and indices, ties and NaNs included.
#[inline(always)]
fn pool_2x2<T: WithDType>(plane: &[T], w: usize, wo: usize, out: &mut [T], arg: &mut [u32]) {
    for (oy, (out, arg)) in out
        .chunks_exact_mut(wo)
        .zip(arg.chunks_exact_mut(wo))
        .enumerate()
    {
        let top = 2 * oy * w;
        let (r0, r1) = (&plane[top..top + 2 * wo], &plane[top + w..top + w + 2 * wo]);
        for (ox, (o, a)) in out.iter_mut().zip(arg.iter_mut()).enumerate() {
            let i = 2 * ox;
            let (mut v, mut k) = (r0[i], top + i);
            for (u, at) in [
                (r0[i + 1], top + i + 1),
                (r1[i], top + w + i),
                (r1[i + 1], top + w + i + 1),
            ] {
                // Strictly greater: ties keep the first maximum.
                let wins = u > v;
                v = if wins { u } else { v };
                k = if wins { at } else { k };
            }
            *o = v;
            *a = k as u32;
        }
    }
}

impl CustomOp1 for MaxPoolOp {
    fn name(&self) -> &'static str {
        "rankwise-max-pool2d"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, c, h, w) = l.shape().dims4()?;
        if self.kernel == 0
            || self.stride == 0
            || h + 2 * self.padding < self.kernel
            || w + 2 * self.padding < self.kernel
            || self.padding >= self.kernel
        {
            candle_core::bail!(
                "max pooling {}×{} stride {} padding {} does not fit {h}×{w}",
                self.kernel,
                self.kernel,
                self.stride,
                self.padding
            );
        }
        let (out, idx) = match s {
            CpuStorage::F32(_) => {
                let (y, i) = self.forward::<f32>(slice(s, l)?, b, c, h, w);
                (CpuStorage::F32(y), i)
            }
            CpuStorage::F64(_) => {
                let (y, i) = self.forward::<f64>(slice(s, l)?, b, c, h, w);
                (CpuStorage::F64(y), i)
            }
            other => candle_core::bail!(
                "rankwise max pooling: unsupported dtype {:?}",
                other.dtype()
            ),
        };
        *self.argmax.lock().expect("max-pool index lock") = idx;
        Ok((out, Shape::from((b, c, self.out_size(h), self.out_size(w)))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (b, c, h, w) = x.dims4()?;
        let (_, _, ho, wo) = grad.dims4()?;
        let idx = self.argmax.lock().expect("max-pool index lock");
        let overlapping = self.stride < self.kernel;
        let dx = match x.dtype() {
            candle_core::DType::F32 => {
                scatter::<f32>(grad, &idx, (b * c, h * w, ho * wo), overlapping)?
            }
            candle_core::DType::F64 => {
                scatter::<f64>(grad, &idx, (b * c, h * w, ho * wo), overlapping)?
            }
            other => candle_core::bail!("rankwise max pooling: unsupported dtype {other:?}"),
        };
        Ok(Some(dx.reshape(x.shape())?))
    }
}

/// The max-pooling gradient: `grad` (`planes × outs` values) added at the input positions `idx`
/// chose, in planes of `size` values. Overlapping windows can send several outputs to one
/// input: those sums are taken in `f64` (rounded once), as the generic path's; otherwise each
/// input receives at most one value and it is copied as is.
fn scatter<T: WithDType>(
    grad: &Tensor,
    idx: &[u32],
    (planes, size, outs): (usize, usize, usize),
    overlapping: bool,
) -> candle_core::Result<Tensor> {
    let mut dx = vec![T::zero(); planes * size];
    with_values::<T, _>(grad, |g| {
        dx.par_chunks_mut(size).enumerate().for_each_init(
            || vec![0.0f64; if overlapping { size } else { 0 }],
            |acc, (p, plane)| {
                let range = p * outs..(p + 1) * outs;
                if overlapping {
                    acc.fill(0.0);
                    for (&i, v) in idx[range.clone()].iter().zip(&g[range]) {
                        acc[i as usize] += v.to_f64();
                    }
                    for (d, a) in plane.iter_mut().zip(acc.iter()) {
                        *d = T::from_f64(*a);
                    }
                } else {
                    for (&i, &v) in idx[range.clone()].iter().zip(&g[range]) {
                        plane[i as usize] = v;
                    }
                }
            },
        );
        Ok(())
    })?;
    Tensor::from_vec(dx, planes * size, grad.device())
}

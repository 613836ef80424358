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
//!   channel and the biased variance `σ²_B`; statistics are accumulated in `f64`;
//! * max pooling: the gradient of each output goes to the first maximum of its window in
//!   row-major order (PyTorch's choice), out-of-image positions acting as −∞.
//!
//! The generic tensor-op versions in [`super::layers`] remain the reference (tests compare the
//! two) and the path on other devices.

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
/// (`C`); returns the output and the batch statistics (for the running averages).
pub(crate) fn batch_norm_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
) -> candle_core::Result<(Tensor, BatchStats)> {
    let stats = Arc::new(Mutex::new(BatchStats::default()));
    let op = BatchNormOp {
        eps,
        stats: stats.clone(),
    };
    let y = x.contiguous()?.apply_op3(gamma, beta, op)?;
    let s = stats.lock().expect("batch-norm statistics lock").clone();
    Ok((y, s))
}

struct BatchNormOp {
    eps: f64,
    stats: Arc<Mutex<BatchStats>>,
}

/// The contiguous values of a CPU storage as `T`.
fn slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("rankwise CPU kernel: expected a contiguous tensor"),
    }
}

fn bn_forward<T: WithDType>(
    x: &[T],
    gamma: &[T],
    beta: &[T],
    dims: (usize, usize, usize),
    eps: f64,
) -> (Vec<T>, BatchStats) {
    let (b, c, hw) = dims;
    let m = (b * hw) as f64;
    let plane = |n: usize, ch: usize| &x[(n * c + ch) * hw..(n * c + ch + 1) * hw];
    let (mean, var): (Vec<f64>, Vec<f64>) = (0..c)
        .into_par_iter()
        .map(|ch| {
            let sum: f64 = (0..b).flat_map(|n| plane(n, ch)).map(|v| v.to_f64()).sum();
            let mean = sum / m;
            let sq: f64 = (0..b)
                .flat_map(|n| plane(n, ch))
                .map(|v| (v.to_f64() - mean).powi(2))
                .sum();
            (mean, sq / m)
        })
        .unzip();
    let inv_std: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let mut y = vec![T::zero(); x.len()];
    y.par_chunks_mut(hw).enumerate().for_each(|(p, out)| {
        let ch = p % c;
        let (g, bt) = (gamma[ch].to_f64(), beta[ch].to_f64());
        for (o, v) in out.iter_mut().zip(&x[p * hw..(p + 1) * hw]) {
            *o = T::from_f64((v.to_f64() - mean[ch]) * inv_std[ch] * g + bt);
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
        let (b, c, h, w) = x.dims4()?;
        let hw = h * w;
        let m = (b * hw) as f64;
        let xs: Vec<f64> = x
            .flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?;
        let gs: Vec<f64> = grad
            .flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?;
        let gam: Vec<f64> = gamma.to_dtype(candle_core::DType::F64)?.to_vec1()?;
        let planes = |ch: usize| (0..b).map(move |n| (n * c + ch) * hw);
        // ∂β and ∂γ per channel.
        let (d_beta, d_gamma): (Vec<f64>, Vec<f64>) = (0..c)
            .into_par_iter()
            .map(|ch| {
                let (mut db, mut dg) = (0.0, 0.0);
                for start in planes(ch) {
                    for k in start..start + hw {
                        let xhat = (xs[k] - stats.mean[ch]) * stats.inv_std[ch];
                        db += gs[k];
                        dg += gs[k] * xhat;
                    }
                }
                (db, dg)
            })
            .unzip();
        let dtype = x.dtype();
        let dev = x.device();
        let grad_x = if x.track_op() {
            let mut dx = vec![0.0f64; xs.len()];
            dx.par_chunks_mut(hw).enumerate().for_each(|(p, out)| {
                let ch = p % c;
                let scale = gam[ch] * stats.inv_std[ch];
                let (mb, mg) = (d_beta[ch] / m, d_gamma[ch] / m);
                for (i, o) in out.iter_mut().enumerate() {
                    let k = p * hw + i;
                    let xhat = (xs[k] - stats.mean[ch]) * stats.inv_std[ch];
                    *o = scale * (gs[k] - mb - xhat * mg);
                }
            });
            Some(Tensor::from_vec(dx, x.shape(), dev)?.to_dtype(dtype)?)
        } else {
            None
        };
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
                for oy in 0..ho {
                    for ox in 0..wo {
                        let mut best: Option<(T, usize)> = None;
                        for ky in 0..self.kernel {
                            let iy = (oy * self.stride + ky) as isize - self.padding as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for kx in 0..self.kernel {
                                let ix = (ox * self.stride + kx) as isize - self.padding as isize;
                                if ix < 0 || ix >= w as isize {
                                    continue;
                                }
                                let k = iy as usize * w + ix as usize;
                                // Strictly greater: ties keep the first maximum.
                                if best.is_none_or(|(v, _)| plane[k] > v) {
                                    best = Some((plane[k], k));
                                }
                            }
                        }
                        let (v, k) = best.expect("every window overlaps the image");
                        out[oy * wo + ox] = v;
                        arg[oy * wo + ox] = k as u32;
                    }
                }
            });
        (y, idx)
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
        let g: Vec<f64> = grad
            .flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?;
        let mut dx = vec![0.0f64; b * c * h * w];
        dx.par_chunks_mut(h * w).enumerate().for_each(|(p, plane)| {
            for o in p * ho * wo..(p + 1) * ho * wo {
                plane[idx[o] as usize] += g[o];
            }
        });
        Ok(Some(
            Tensor::from_vec(dx, x.shape(), x.device())?.to_dtype(x.dtype())?,
        ))
    }
}

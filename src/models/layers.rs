//! Layers shared by the backbones and the head, with PyTorch's parameter names, initialisations
//! and formulas: convolution, batch normalisation (live or frozen), linear, max pooling with an
//! exact gradient, global pooling, LayerNorm without affine parameters, L2 normalisation.

use super::params::{torch_default_uniform, KAIMING_NORMAL_FAN_OUT};
use crate::error::Result;
use candle_core::{DType, Tensor, Var, D};
use candle_nn::init::Init;
use candle_nn::{Module, VarBuilder};
use serde::{Deserialize, Serialize};

mod relu;
mod running_stats;

/// A 2-D convolution with `weight` (`out × in × k × k`) and optional `bias`, initialised as
/// torchvision's ResNet (`kaiming_normal_`, fan-out, ReLU gain; bias zero).
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor,
    bias: Option<Tensor>,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    /// A `kernel × kernel` convolution from `in_channels` to `out_channels`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
        vb: VarBuilder,
    ) -> Result<Self> {
        let weight = vb.get_with_hints(
            (out_channels, in_channels, kernel, kernel),
            "weight",
            KAIMING_NORMAL_FAN_OUT,
        )?;
        let bias = if bias {
            Some(vb.get_with_hints(out_channels, "bias", Init::Const(0.))?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            stride,
            padding,
        })
    }

    /// `B × in × H × W` → `B × out × H' × W'`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = super::conv::conv2d(x, &self.weight, self.stride, self.padding)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(&b.reshape((1, (), 1, 1))?)?,
            None => y,
        })
    }
}

/// A training batch's second statistic per channel, as its forward pass produced it: the
/// biased variance `σ²`, or cuDNN's saved `1/√(σ² + ε)` (the running-average kernel derives
/// `σ²` from it without three more launches).
enum Spread {
    Var(Tensor),
    #[cfg_attr(not(any(feature = "cudnn", test)), allow(dead_code))]
    InvStd(Tensor),
}

/// 2-D batch normalisation with PyTorch's names (`weight`, `bias`, `running_mean`,
/// `running_var`) and formulas (biased batch variance to normalise, unbiased variance in the
/// running average, `momentum` 0.1, `eps` 1e-5).
///
/// **Frozen** (HAPPIER `freeze_batch_norm`, Smooth-AP): always uses the running statistics, in
/// training too, and never updates them; `weight` and `bias` stay trainable, as in the authors'
/// code where the BN modules are kept in eval mode but their affine parameters are optimised.
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    weight: Tensor,
    bias: Tensor,
    running_mean: Var,
    running_var: Var,
    eps: f64,
    momentum: f64,
    frozen: bool,
}

impl BatchNorm2d {
    /// Batch norm over `channels`; `frozen` keeps it in evaluation mode forever.
    pub fn new(channels: usize, frozen: bool, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(channels, "weight", Init::Const(1.))?;
        let bias = vb.get_with_hints(channels, "bias", Init::Const(0.))?;
        let running_mean = vb.get_with_hints(channels, "running_mean", Init::Const(0.))?;
        let running_var = vb.get_with_hints(channels, "running_var", Init::Const(1.))?;
        Ok(BatchNorm2d {
            weight,
            bias,
            // The store hands out variables: `from_tensor` shares their storage, so the running
            // statistics updated here are the ones checkpointed.
            running_mean: Var::from_tensor(&running_mean)?,
            running_var: Var::from_tensor(&running_var)?,
            eps: 1e-5,
            momentum: 0.1,
            frozen,
        })
    }

    /// Whether the layer uses the statistics of the batch when training (not frozen).
    pub fn uses_batch_statistics(&self) -> bool {
        !self.frozen
    }

    /// `B × C × H × W` → same shape. With `train` and not frozen: normalises with the batch
    /// statistics and updates the running averages; otherwise uses the running statistics.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_maybe_relu(x, train, false)
    }

    /// `relu(forward(x, train))`: on the CPU in training one fused op (see
    /// `super::cpu_ops::batch_norm_train`), elsewhere the two ops.
    pub fn forward_relu(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_maybe_relu(x, train, true)
    }

    /// `relu(forward(x, train) + residual)`, a ResNet block's end: on the CPU in training one
    /// fused op (see `super::cpu_ops::batch_norm_add_relu_train`), elsewhere the three ops.
    pub fn forward_add_relu(&self, x: &Tensor, residual: &Tensor, train: bool) -> Result<Tensor> {
        if !train || self.frozen || !x.device().is_cpu() {
            return relu::add_relu(&self.forward(x, train)?, residual);
        }
        let (n, _, h, w) = x.dims4()?;
        let (y, stats) = super::cpu_ops::batch_norm_add_relu_train(
            x,
            &self.weight,
            &self.bias,
            residual,
            self.eps,
        )?;
        let dev = x.device();
        let mean = Tensor::new(stats.mean, dev)?.to_dtype(x.dtype())?;
        let var = Spread::Var(Tensor::new(stats.var, dev)?.to_dtype(x.dtype())?);
        self.update_running_stats(&mean, &var, n * h * w)?;
        Ok(y)
    }

    fn forward_maybe_relu(&self, x: &Tensor, train: bool, relu: bool) -> Result<Tensor> {
        let then_relu = |y: Tensor| -> Result<Tensor> {
            if relu {
                self::relu::relu(&y)
            } else {
                Ok(y)
            }
        };
        if !train || self.frozen {
            // y = x·a + b with a = γ/√(σ²_run + ε), b = β − μ_run·a: two passes over x.
            let shape = (1, (), 1, 1);
            let a = self
                .weight
                .broadcast_div(&(self.running_var.as_detached_tensor() + self.eps)?.sqrt()?)?;
            let b = (&self.bias - a.broadcast_mul(&self.running_mean.as_detached_tensor())?)?;
            if x.device().is_cpu() {
                // The same value in one pass (see the op).
                return Ok(super::cpu_ops::channel_affine(x, &a, &b, relu)?);
            }
            return then_relu(
                x.broadcast_mul(&a.reshape(shape)?)?
                    .broadcast_add(&b.reshape(shape)?)?,
            );
        }
        let (n, _, h, w) = x.dims4()?;
        let (y, mean, var) = if x.device().is_cpu() {
            let (y, stats) =
                super::cpu_ops::batch_norm_train(x, &self.weight, &self.bias, self.eps, relu)?;
            let dev = x.device();
            (
                y,
                Tensor::new(stats.mean, dev)?.to_dtype(x.dtype())?,
                Spread::Var(Tensor::new(stats.var, dev)?.to_dtype(x.dtype())?),
            )
        } else {
            let (y, mean, spread) = self.forward_train_device(x)?;
            (then_relu(y)?, mean, spread)
        };
        self.update_running_stats(&mean, &var, n * h * w)?;
        Ok(y)
    }

    /// Training-mode forward on a device other than the CPU: cuDNN's kernels where they apply
    /// (feature `cudnn`, see `super::cudnn`), otherwise [`Self::forward_train_generic`].
    fn forward_train_device(&self, x: &Tensor) -> Result<(Tensor, Tensor, Spread)> {
        #[cfg(feature = "cudnn")]
        if super::cudnn::applies(x) {
            let (y, mean, inv_std) =
                super::cudnn::batch_norm_train(x, &self.weight, &self.bias, self.eps)?;
            return Ok((y, mean, Spread::InvStd(inv_std)));
        }
        let (y, mean, var) = self.forward_train_generic(x)?;
        Ok((y, mean, Spread::Var(var)))
    }

    /// Training-mode forward with candle's tensor ops (any device): output, batch mean and
    /// biased batch variance (both `C`, detached).
    ///
    /// The normalisation `x̂ = (x − μ)/√(σ² + ε)` is computed outside the graph and attached by
    /// [`crate::attach::attach`] with [`normalize_backward`], the closed form of BatchNorm's input gradient: left to
    /// autograd, the mean, the centring, the square, the variance and the division each kept an
    /// activation-sized tensor for the backward pass (ResNet-50 at batch 256 peaked at ~124 GB
    /// on an H200, benches/gpu/), and each was one more kernel launch.
    pub(crate) fn forward_train_generic(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (n, c, h, wd) = x.dims4()?;
        let count = (n * h * wd) as f64;
        // (B, C, H·W): per-channel sums over dims 0 and 2, no transposed copy.
        let x3 = x.detach().reshape((n, c, h * wd))?;
        let mean = (x3.sum_keepdim(2)?.sum_keepdim(0)? / count)?;
        let centred = x3.broadcast_sub(&mean)?;
        let var = (centred.sqr()?.sum_keepdim(2)?.sum_keepdim(0)? / count)?;
        let inv_std = (var.clone() + self.eps)?.sqrt()?.recip()?;
        let normalised = centred.broadcast_mul(&inv_std)?.reshape((n, c, h, wd))?;
        let normalised = if x.track_op() {
            crate::attach::attach(x, &normalised, move |_x, xhat, grad| {
                normalize_backward(xhat, grad, &inv_std).map(Some)
            })?
        } else {
            normalised
        };
        let shape = (1, (), 1, 1);
        let y = normalised
            .broadcast_mul(&self.weight.reshape(shape)?)?
            .broadcast_add(&self.bias.reshape(shape)?)?;
        Ok((y, mean.flatten_all()?, var.flatten_all()?))
    }

    /// PyTorch's running averages: `μ ← (1 − m)μ + m·mean`, `σ² ← (1 − m)σ² + m·var·n/(n − 1)`
    /// (the unbiased batch variance), `n` values per channel.
    fn update_running_stats(&self, mean: &Tensor, spread: &Spread, count: usize) -> Result<()> {
        let m = self.momentum;
        let unbias = if count > 1 {
            count as f64 / (count - 1) as f64
        } else {
            1.0
        };
        let (rm, rv) = (
            self.running_mean.as_detached_tensor(),
            self.running_var.as_detached_tensor(),
        );
        if running_stats::applies(&rm) && running_stats::applies(&rv) && rm.elem_count() > 0 {
            // In place, one launch per statistic (`running_stats`), the variance derived there
            // from cuDNN's 1/√(σ² + ε): same values.
            running_stats::update(&rm, mean, 1.0 - m, m, None)?;
            return match spread {
                Spread::Var(var) => running_stats::update(&rv, var, 1.0 - m, m * unbias, None),
                Spread::InvStd(s) => {
                    running_stats::update(&rv, s, 1.0 - m, m * unbias, Some(self.eps))
                }
            };
        }
        let var = match spread {
            Spread::Var(var) => var.clone(),
            Spread::InvStd(s) => (s.sqr()?.recip()? - self.eps)?,
        };
        let new_mean = ((rm * (1.0 - m))? + (mean * m)?)?;
        let new_var = ((rv * (1.0 - m))? + (&var * (m * unbias))?)?;
        self.running_mean.set(&new_mean)?;
        self.running_var.set(&new_var)?;
        Ok(())
    }
}

/// The input gradient of `x̂ = (x − μ)/√(σ² + ε)` (attached by
/// [`BatchNorm2d::forward_train_generic`]) from `∂x̂`:
/// `∂x = (∂x̂ − mean(∂x̂) − x̂·mean(∂x̂·x̂)) / √(σ² + ε)`, the means per channel over the batch
/// and the positions (Ioffe & Szegedy 2015, §3, with γ folded into `∂x̂`); `inv_std` is
/// `1/√(σ² + ε)`, shape `(1, C, 1)`.
fn normalize_backward(
    xhat: &Tensor,
    grad: &Tensor,
    inv_std: &Tensor,
) -> candle_core::Result<Tensor> {
    let (n, c, h, w) = grad.dims4()?;
    let count = (n * h * w) as f64;
    let g = grad.reshape((n, c, h * w))?;
    let xhat = xhat.detach().reshape((n, c, h * w))?;
    let mean_g = (g.sum_keepdim(2)?.sum_keepdim(0)? / count)?;
    let mean_gx = ((&g * &xhat)?.sum_keepdim(2)?.sum_keepdim(0)? / count)?;
    g.broadcast_sub(&mean_g)?
        .sub(&xhat.broadcast_mul(&mean_gx)?)?
        .broadcast_mul(inv_std)?
        .reshape((n, c, h, w))
}

/// A fully connected layer `y = x Wᵀ + b` with PyTorch's default initialisation
/// (`U(±1/√in)` for weight and bias).
pub fn linear(
    in_features: usize,
    out_features: usize,
    vb: VarBuilder,
) -> Result<candle_nn::Linear> {
    let init = torch_default_uniform(in_features);
    let w = vb.get_with_hints((out_features, in_features), "weight", init)?;
    let b = vb.get_with_hints(out_features, "bias", init)?;
    Ok(candle_nn::Linear::new(w, Some(b)))
}

/// Applies a [`candle_nn::Linear`] (kept as a function so callers need not import `Module`).
pub fn apply_linear(layer: &candle_nn::Linear, x: &Tensor) -> Result<Tensor> {
    Ok(layer.forward(x)?)
}

/// Max pooling (`kernel × kernel`, `stride`, `padding` filled with −∞) whose gradient goes to the
/// first maximum of each window in row-major order, as PyTorch's `max_pool2d`.
///
/// candle 0.11's own `max_pool2d` has no backward for overlapping windows and scales the
/// gradient by `1 / kernel²` otherwise, so it cannot be trained through. On the CPU this is the
/// kernel of `super::cpu_ops`; elsewhere the windows are stacked, their arg-max taken (no
/// gradient) and the values gathered, whose backward is a scatter-add to the arg-max.
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    if kernel == 0
        || stride == 0
        || padding >= kernel
        || h + 2 * padding < kernel
        || w + 2 * padding < kernel
    {
        return Err(crate::Error::Shape(format!(
            "max pooling {kernel}×{kernel} stride {stride} padding {padding} does not fit a \
             {h}×{w} input"
        )));
    }
    if x.device().is_cpu() {
        return Ok(super::cpu_ops::max_pool2d(x, kernel, stride, padding)?);
    }
    #[cfg(feature = "cudnn")]
    if super::cudnn::applies(x) {
        return super::cudnn::max_pool2d(x, kernel, stride, padding);
    }
    max_pool2d_generic(x, kernel, stride, padding)
}

/// [`max_pool2d`] with candle's tensor ops (any device; arguments already checked).
pub(crate) fn max_pool2d_generic(
    x: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let ho = (h + 2 * padding - kernel) / stride + 1;
    let wo = (w + 2 * padding - kernel) / stride + 1;
    // Every window offset `d` reads positions d, d + s, …, d + s(o − 1); reshaping s·o values to
    // o × s and keeping column 0 needs s·o values from d, hence the extra padding at the end.
    let pad_end =
        |size: usize, out: usize| (kernel - 1 + stride * out).saturating_sub(size + padding);
    let xp = pad_neg_inf(x, 2, padding, pad_end(h, ho))?;
    let xp = pad_neg_inf(&xp, 3, padding, pad_end(w, wo))?;
    let wp = xp.dim(3)?;
    let mut windows = Vec::with_capacity(kernel * kernel);
    for dy in 0..kernel {
        let rows = xp
            .narrow(2, dy, stride * ho)?
            .reshape((b, c, ho, stride, wp))?
            .narrow(3, 0, 1)?
            .squeeze(3)?;
        for dx in 0..kernel {
            let v = rows
                .narrow(3, dx, stride * wo)?
                .reshape((b, c, ho, wo, stride))?
                .narrow(4, 0, 1)?;
            windows.push(v);
        }
    }
    let stacked = Tensor::cat(&windows, 4)?.contiguous()?;
    let idx = stacked.detach().argmax_keepdim(4)?;
    Ok(stacked.gather(&idx, 4)?.squeeze(4)?)
}

/// Pads dimension `dim` with `before` and `after` slices of −∞.
fn pad_neg_inf(x: &Tensor, dim: usize, before: usize, after: usize) -> Result<Tensor> {
    if before == 0 && after == 0 {
        return Ok(x.clone());
    }
    let mut parts = Vec::with_capacity(3);
    let mut dims = x.dims().to_vec();
    if before > 0 {
        dims[dim] = before;
        parts.push(Tensor::full(f32::NEG_INFINITY, dims.clone(), x.device())?.to_dtype(x.dtype())?);
    }
    parts.push(x.clone());
    if after > 0 {
        dims[dim] = after;
        parts.push(Tensor::full(f32::NEG_INFINITY, dims, x.device())?.to_dtype(x.dtype())?);
    }
    Ok(Tensor::cat(&parts, dim)?)
}

/// Global pooling of a feature map into one vector per image (the papers' `RetrievalNet`
/// pooling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Global average pooling (`AdaptiveAvgPool2d(1)`, the papers' default).
    #[default]
    Avg,
    /// Global max pooling (`AdaptiveMaxPool2d(1)`; gradient to the first maximum).
    Max,
}

/// `B × C × H × W` → `B × C` by [`Pooling`].
pub fn global_pool(x: &Tensor, pooling: Pooling) -> Result<Tensor> {
    let (b, c, _, _) = x.dims4()?;
    let flat = x.reshape((b, c, ()))?;
    Ok(match pooling {
        Pooling::Avg => flat.mean(2)?,
        Pooling::Max => {
            let idx = flat.detach().argmax_keepdim(2)?;
            flat.gather(&idx, 2)?.squeeze(2)?
        }
    })
}

/// PyTorch `LayerNorm(d, elementwise_affine=False)` over the last dimension: `(x − mean) ·
/// (var + eps)^(−1/2)` with the biased variance and `eps = 1e-5` (HAPPIER's `norm_features`).
pub fn layer_norm_no_affine(x: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centred = x.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(centred.broadcast_mul(&(var + eps)?.sqrt()?.recip()?)?)
}

/// PyTorch `F.normalize(x, p=2, dim=-1)`: `x / max(‖x‖₂, 1e-12)`.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.maximum(1e-12)?;
    Ok(x.broadcast_div(&norm)?)
}

/// Checks that a batch of images is a 4-D float tensor with `channels` channels.
pub fn check_images(x: &Tensor, channels: usize) -> Result<()> {
    let dims = x.dims();
    if dims.len() != 4 || dims[1] != channels {
        return Err(crate::Error::Shape(format!(
            "expected a B × {channels} × H × W batch of images, got shape {dims:?}"
        )));
    }
    if !matches!(
        x.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16
    ) {
        return Err(crate::Error::invalid(
            "images",
            format!("expected a float tensor, got {:?}", x.dtype()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ParamStore;
    use candle_core::Device;

    fn t4(v: &[f32], shape: (usize, usize, usize, usize)) -> Tensor {
        Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn max_pool_matches_hand_computed_windows_and_gradient() {
        let v: Vec<f32> = (0..25).map(|i| ((i * 7) % 11) as f32).collect();
        let x = Var::from_tensor(&t4(&v, (1, 1, 5, 5))).unwrap();
        // 3×3, stride 2, padding 1 (the ResNet stem): 3×3 output.
        let y = max_pool2d(x.as_tensor(), 3, 2, 1).unwrap();
        assert_eq!(y.dims(), &[1, 1, 3, 3]);
        let yv: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        let at = |r: i64, c: i64| {
            if (0..5).contains(&r) && (0..5).contains(&c) {
                v[(r * 5 + c) as usize]
            } else {
                f32::NEG_INFINITY
            }
        };
        let mut expected_grad = [0f32; 25];
        for oy in 0..3i64 {
            for ox in 0..3i64 {
                let mut best = (f32::NEG_INFINITY, 0usize);
                for dy in 0..3 {
                    for dx in 0..3 {
                        let (r, c) = (2 * oy - 1 + dy, 2 * ox - 1 + dx);
                        if at(r, c) > best.0 {
                            best = (at(r, c), (r * 5 + c) as usize);
                        }
                    }
                }
                assert_eq!(yv[(oy * 3 + ox) as usize], best.0);
                expected_grad[best.1] += 1.0;
            }
        }
        let g = y.sum_all().unwrap().backward().unwrap();
        let gv: Vec<f32> = g
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(gv, expected_grad);
    }

    /// Values and gradients (`x`, then `params`) of `Σ r ⊙ f(x)`, `r = sin(0, 1, 2, …)` in `x`'s
    /// dtype, as `f64` vectors.
    fn value_and_grads(x: &Var, params: &[&Var], f: impl Fn(&Tensor) -> Tensor) -> Vec<Vec<f64>> {
        let flat = |t: &Tensor| -> Vec<f64> {
            t.to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let y = f(x.as_tensor());
        let r = Tensor::arange(0f64, y.elem_count() as f64, y.device())
            .unwrap()
            .reshape(y.dims())
            .unwrap()
            .sin()
            .unwrap()
            .to_dtype(y.dtype())
            .unwrap();
        let g = (&y * r).unwrap().sum_all().unwrap().backward().unwrap();
        let mut out = vec![flat(&y), flat(g.get(x.as_tensor()).unwrap())];
        out.extend(params.iter().map(|p| flat(g.get(p.as_tensor()).unwrap())));
        out
    }

    /// [`value_and_grads`] for the CPU kernel and the generic tensor-op path.
    fn both_paths(
        x: &Var,
        params: &[&Var],
        fast: impl Fn(&Tensor) -> Tensor,
        generic: impl Fn(&Tensor) -> Tensor,
    ) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        (
            value_and_grads(x, params, fast),
            value_and_grads(x, params, generic),
        )
    }

    fn assert_all_close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
        for (k, (u, v)) in a.iter().zip(b).enumerate() {
            assert_eq!(u.len(), v.len());
            let d = u
                .iter()
                .zip(v)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f64::max);
            assert!(d < 1e-10, "{what}, output {k}: max difference {d}");
        }
    }

    #[test]
    fn cpu_max_pool_equals_the_generic_path() {
        let d = Device::Cpu;
        for &(hw, k, s, p) in &[
            (7, 3, 2, 1),
            (8, 3, 2, 1),
            (8, 2, 2, 0),
            (5, 2, 1, 0),
            (6, 3, 3, 1),
        ] {
            let x = Var::randn(0f64, 1.0, (2, 3, hw, hw), &d).unwrap();
            // Rounded to few values, most windows hold ties: the gradient must go to the same
            // (first) maximum on both paths.
            let tied = Var::from_tensor(&x.as_tensor().round().unwrap()).unwrap();
            for (x, what) in [(&x, ""), (&tied, " tied")] {
                let (a, b) = both_paths(
                    x,
                    &[],
                    |t| max_pool2d(t, k, s, p).unwrap(),
                    |t| max_pool2d_generic(t, k, s, p).unwrap(),
                );
                assert_all_close(&a, &b, &format!("{hw} k{k} s{s} p{p}{what}"));
            }
        }
    }

    #[test]
    fn evaluation_batch_norm_in_one_op_equals_the_candle_ops() {
        let d = Device::Cpu;
        let store = ParamStore::new(1);
        let vb = store.var_builder(DType::F64, &d);
        let bn = BatchNorm2d::new(3, false, vb.pp("bn")).unwrap();
        let set = |name: &str, v: [f64; 3]| {
            let t = Tensor::new(&v, &d).unwrap();
            store.get(name).unwrap().set(&t).unwrap();
        };
        set("bn.weight", [0.5, -1.5, 2.0]);
        set("bn.bias", [0.1, 0.2, -0.3]);
        set("bn.running_mean", [0.3, -0.2, 1.0]);
        set("bn.running_var", [0.8, 1.7, 0.2]);
        let (w, b) = (
            store.get("bn.weight").unwrap(),
            store.get("bn.bias").unwrap(),
        );
        // The candle formulation the op replaces: x·a + b with a and b as the layer forms them.
        let reference = |t: &Tensor, relu: bool| {
            let rv = store.get("bn.running_var").unwrap().as_detached_tensor();
            let rm = store.get("bn.running_mean").unwrap().as_detached_tensor();
            let a = w
                .as_tensor()
                .broadcast_div(&(rv + 1e-5).unwrap().sqrt().unwrap())
                .unwrap();
            let bb = (b.as_tensor() - a.broadcast_mul(&rm).unwrap()).unwrap();
            let y = t
                .broadcast_mul(&a.reshape((1, (), 1, 1)).unwrap())
                .unwrap()
                .broadcast_add(&bb.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            if relu {
                y.relu().unwrap()
            } else {
                y
            }
        };
        for relu in [false, true] {
            let x = Var::randn(0f64, 2.0, (2, 3, 5, 3), &d).unwrap();
            let (fast, slow) = both_paths(
                &x,
                &[&w, &b],
                |t| {
                    if relu {
                        bn.forward_relu(t, false).unwrap()
                    } else {
                        bn.forward(t, false).unwrap()
                    }
                },
                |t| reference(t, relu),
            );
            // The values to the bit, the gradients to rounding.
            assert_eq!(fast[0], slow[0], "relu {relu}");
            assert_all_close(&fast, &slow, &format!("evaluation batch norm, relu {relu}"));
        }
    }

    /// Two f64 batch norms of 3 channels, `fast` and `generic`, with the same non-trivial
    /// weights, in one store.
    fn two_batch_norms() -> (ParamStore, BatchNorm2d, BatchNorm2d) {
        let d = Device::Cpu;
        let store = ParamStore::new(1);
        let vb = store.var_builder(DType::F64, &d);
        let fast = BatchNorm2d::new(3, false, vb.pp("fast")).unwrap();
        let generic = BatchNorm2d::new(3, false, vb.pp("generic")).unwrap();
        for name in ["fast.weight", "generic.weight"] {
            let w = Tensor::new(&[0.5f64, -1.5, 2.0], &d).unwrap();
            store.get(name).unwrap().set(&w).unwrap();
        }
        (store, fast, generic)
    }

    #[test]
    fn cpu_batch_norm_add_relu_equals_the_three_ops() {
        let d = Device::Cpu;
        let (store, fast, generic) = two_batch_norms();
        // Odd sizes; a residual large enough that the ReLU cuts about half of the outputs.
        for (b, hw) in [(4, 5), (3, 1), (2, 7)] {
            // Fixed values (candle's CPU `randn` is not seeded: an unlucky draw of the 9
            // outputs of the 3 × 3 × 1² case could leave fewer than 2 of them cut).
            let wave = |f: f64, phase: f64, scale: f64, shift: f64| {
                let t = Tensor::arange(0f64, (b * 3 * hw * hw) as f64, &d).unwrap();
                let v = ((t * f).unwrap() + phase).unwrap().sin().unwrap();
                let v = ((v * scale).unwrap() + shift).unwrap();
                Var::from_tensor(&v.reshape((b, 3, hw, hw)).unwrap()).unwrap()
            };
            let x = wave(1.7, 0.3, 2.0, 1.0);
            let r = wave(2.3, 1.1, 1.5, 0.0);
            let with = |bn: &BatchNorm2d, fused: bool| {
                let (w, bias) = if fused {
                    ("fast.weight", "fast.bias")
                } else {
                    ("generic.weight", "generic.bias")
                };
                let (w, bias) = (store.get(w).unwrap(), store.get(bias).unwrap());
                let y = if fused {
                    bn.forward_add_relu(x.as_tensor(), r.as_tensor(), true)
                        .unwrap()
                } else {
                    (bn.forward_train_generic(x.as_tensor()).unwrap().0 + r.as_tensor())
                        .unwrap()
                        .relu()
                        .unwrap()
                };
                let weights = Tensor::arange(0f64, y.elem_count() as f64, &d)
                    .unwrap()
                    .reshape(y.dims())
                    .unwrap()
                    .sin()
                    .unwrap();
                let g = (&y * weights)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let flat = |t: &Tensor| -> Vec<f64> { t.flatten_all().unwrap().to_vec1().unwrap() };
                vec![
                    flat(&y),
                    flat(g.get(x.as_tensor()).unwrap()),
                    flat(g.get(r.as_tensor()).unwrap()),
                    flat(g.get(w.as_tensor()).unwrap()),
                    flat(g.get(bias.as_tensor()).unwrap()),
                ]
            };
            let (a, b2) = (with(&fast, true), with(&generic, false));
            assert!(a[0].iter().filter(|&&v| v == 0.0).count() > a[0].len() / 5);
            assert_all_close(
                &a,
                &b2,
                &format!("batch norm + residual + ReLU, {b}×3×{hw}²"),
            );
        }
        // Frozen or in evaluation it is the three ops.
        let x = Tensor::randn(0f64, 1.0, (2, 3, 4, 4), &d).unwrap();
        let r = Tensor::randn(0f64, 1.0, (2, 3, 4, 4), &d).unwrap();
        let eval = fast.forward_add_relu(&x, &r, false).unwrap();
        let three = (fast.forward(&x, false).unwrap() + &r)
            .unwrap()
            .relu()
            .unwrap();
        assert_eq!(
            eval.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
            three.flatten_all().unwrap().to_vec1::<f64>().unwrap()
        );
    }

    #[test]
    fn the_running_variance_from_cudnns_inverse_std_is_the_variances() {
        // The tensor path of `Spread::InvStd` (a device without the kernels): 1/s² − ε of
        // s = 1/√(σ² + ε) gives σ² back to rounding, and the running averages follow.
        let d = Device::Cpu;
        let (store, fast, generic) = two_batch_norms();
        let var = Tensor::new(&[0.5f64, 2.0, 1e-3], &d).unwrap();
        let mean = Tensor::new(&[0.1f64, -0.2, 0.3], &d).unwrap();
        let inv_std = (var.clone() + fast.eps)
            .unwrap()
            .sqrt()
            .unwrap()
            .recip()
            .unwrap();
        fast.update_running_stats(&mean, &Spread::Var(var), 10)
            .unwrap();
        generic
            .update_running_stats(&mean, &Spread::InvStd(inv_std), 10)
            .unwrap();
        for stat in ["running_mean", "running_var"] {
            let get = |bn: &str| -> Vec<f64> {
                store
                    .get(&format!("{bn}.{stat}"))
                    .unwrap()
                    .as_tensor()
                    .to_vec1()
                    .unwrap()
            };
            for (a, b) in get("fast").iter().zip(get("generic")) {
                assert!(
                    (a - b).abs() <= 1e-12 * a.abs().max(1.0),
                    "{stat}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn cpu_batch_norm_equals_the_generic_path() {
        let d = Device::Cpu;
        let (store, fast, generic) = two_batch_norms();
        let x = Var::randn(1f64, 2.0, (4, 3, 5, 5), &d).unwrap();
        let wf = store.get("fast.weight").unwrap();
        let bf = store.get("fast.bias").unwrap();
        let (a, _) = both_paths(
            &x,
            &[&wf, &bf],
            |t| fast.forward(t, true).unwrap(),
            |t| fast.forward(t, true).unwrap(),
        );
        let wg = store.get("generic.weight").unwrap();
        let bg = store.get("generic.bias").unwrap();
        let (b, _) = both_paths(
            &x,
            &[&wg, &bg],
            |t| generic.forward_train_generic(t).unwrap().0,
            |t| generic.forward_train_generic(t).unwrap().0,
        );
        assert_all_close(&a, &b, "batch norm");
        // Running statistics: the fast path updated them twice (two forward passes above).
        let (_, mean, var) = generic.forward_train_generic(x.as_tensor()).unwrap();
        for _ in 0..2 {
            generic
                .update_running_stats(&mean, &Spread::Var(var.clone()), 100)
                .unwrap();
        }
        for stat in ["running_mean", "running_var"] {
            let u: Vec<f64> = store
                .get(&format!("fast.{stat}"))
                .unwrap()
                .as_tensor()
                .to_vec1()
                .unwrap();
            let v: Vec<f64> = store
                .get(&format!("generic.{stat}"))
                .unwrap()
                .as_tensor()
                .to_vec1()
                .unwrap();
            assert_all_close(&[u], &[v], stat);
        }
    }

    #[test]
    fn fused_batch_norm_relu_equals_batch_norm_then_relu() {
        let d = Device::Cpu;
        // Planes of 25 values (not a multiple of the kernels' 8 lanes) and of 16 (a multiple);
        // f64 to 1e-10, and f32 against the f64 reference to f32 rounding.
        for &(b, hw) in &[(3, 5), (2, 4), (1, 1)] {
            let store = ParamStore::new(1);
            let vb = store.var_builder(DType::F64, &d);
            let bn = BatchNorm2d::new(3, false, vb.pp("bn")).unwrap();
            let w = Tensor::new(&[0.5f64, -1.5, 2.0], &d).unwrap();
            store.get("bn.weight").unwrap().set(&w).unwrap();
            let beta = Tensor::new(&[0.1f64, 0.3, -0.2], &d).unwrap();
            store.get("bn.bias").unwrap().set(&beta).unwrap();
            let x = Var::randn(1f64, 2.0, (b, 3, hw, hw), &d).unwrap();
            let gamma = store.get("bn.weight").unwrap();
            let bias = store.get("bn.bias").unwrap();
            let (fused, generic) = both_paths(
                &x,
                &[&gamma, &bias],
                |t| bn.forward_relu(t, true).unwrap(),
                |t| bn.forward_train_generic(t).unwrap().0.relu().unwrap(),
            );
            assert_all_close(&fused, &generic, &format!("batch norm + ReLU {b}×3×{hw}²"));
            // About half the outputs are cut by the ReLU: the mask is exercised.
            let zeros = fused[0].iter().filter(|v| **v == 0.0).count();
            assert!(b * hw * hw < 4 || (zeros > 0 && zeros < fused[0].len()));

            if b * hw * hw == 1 {
                // One value per channel: σ² = 0, 1/√ε = 316 scales x's f32 rounding in
                // x·(γ/σ) + (β − μγ/σ) (PyTorch's form too) far past the f64 path's exact x − μ.
                continue;
            }
            let store32 = ParamStore::new(1);
            let bn32 =
                BatchNorm2d::new(3, false, store32.var_builder(DType::F32, &d).pp("bn")).unwrap();
            let to32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            store32.get("bn.weight").unwrap().set(&to32(&w)).unwrap();
            store32.get("bn.bias").unwrap().set(&to32(&beta)).unwrap();
            let x32 = Var::from_tensor(&to32(x.as_tensor())).unwrap();
            let got = value_and_grads(&x32, &[], |t| bn32.forward_relu(t, true).unwrap());
            for (k, (u, v)) in got.iter().zip(&generic).enumerate() {
                let scale = v.iter().fold(1.0f64, |m, q| m.max(q.abs()));
                let diff = u
                    .iter()
                    .zip(v)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0.0, f64::max);
                assert!(
                    diff < 1e-5 * scale,
                    "f32 output {k}: {diff} (scale {scale})"
                );
            }
        }
    }

    #[test]
    fn cpu_max_pool_in_f32_equals_the_generic_path() {
        let d = Device::Cpu;
        let x = Var::randn(0f32, 1.0, (3, 2, 9, 9), &d).unwrap();
        for &(k, s, p) in &[(3, 2, 1), (2, 2, 0)] {
            let (fast, generic) = both_paths(
                &x,
                &[],
                |t| max_pool2d(t, k, s, p).unwrap(),
                |t| max_pool2d_generic(t, k, s, p).unwrap(),
            );
            assert_eq!(fast[0], generic[0], "k{k} s{s} p{p} value");
            let diff = fast[1]
                .iter()
                .zip(&generic[1])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(diff < 1e-6, "k{k} s{s} p{p} gradient: {diff}");
        }
    }

    #[test]
    fn max_pool_ties_go_to_the_first_maximum() {
        let x = Var::from_tensor(&t4(&[1., 1., 1., 1.], (1, 1, 2, 2))).unwrap();
        let y = max_pool2d(x.as_tensor(), 2, 2, 0).unwrap();
        let g = y.sum_all().unwrap().backward().unwrap();
        let gv: Vec<f32> = g
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(gv, vec![1., 0., 0., 0.]);
        assert!(max_pool2d(x.as_tensor(), 3, 1, 0).is_err());
    }

    #[test]
    fn global_pools() {
        let x = t4(&[1., 5., 3., 2., 0., 0., 4., 0.], (1, 2, 2, 2));
        let avg: Vec<f32> = global_pool(&x, Pooling::Avg)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(avg, vec![2.75, 1.0]);
        let max: Vec<f32> = global_pool(&x, Pooling::Max)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(max, vec![5.0, 4.0]);
    }

    #[test]
    fn layer_norm_and_l2() {
        let x = Tensor::new(&[[1f32, 2., 3., 6.]], &Device::Cpu).unwrap();
        let y: Vec<f32> = layer_norm_no_affine(&x, 1e-5)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5.
        let s = (3.5f64 + 1e-5).sqrt();
        for (a, b) in y.iter().zip([-2.0, -1.0, 0.0, 3.0]) {
            assert!((*a as f64 - b / s).abs() < 1e-6);
        }
        let z: Vec<f32> =
            l2_normalize(&Tensor::new(&[[3f32, 4.], [0., 0.]], &Device::Cpu).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
        assert_eq!(z, vec![0.6, 0.8, 0.0, 0.0]);
    }

    #[test]
    fn batch_norm_train_and_frozen() {
        let store = ParamStore::new(0);
        let vb = store.var_builder(DType::F32, &Device::Cpu);
        let live = BatchNorm2d::new(1, false, vb.pp("live")).unwrap();
        let frozen = BatchNorm2d::new(1, true, vb.pp("frozen")).unwrap();
        let x = t4(&[1., 2., 3., 4., 5., 6., 7., 8.], (2, 1, 2, 2));
        let y: Vec<f32> = live
            .forward(&x, true)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // mean 4.5, biased variance 5.25.
        let s = (5.25f64 + 1e-5).sqrt();
        for (i, v) in y.iter().enumerate() {
            assert!((*v as f64 - (i as f64 + 1.0 - 4.5) / s).abs() < 1e-6);
        }
        let rm: Vec<f32> = store
            .get("live.running_mean")
            .unwrap()
            .as_tensor()
            .to_vec1()
            .unwrap();
        let rv: Vec<f32> = store
            .get("live.running_var")
            .unwrap()
            .as_tensor()
            .to_vec1()
            .unwrap();
        assert!((rm[0] - 0.45).abs() < 1e-6);
        // 0.9 · 1 + 0.1 · 5.25 · 8/7 (unbiased).
        assert!((rv[0] as f64 - (0.9 + 0.1 * 6.0)).abs() < 1e-6);
        // Frozen: identity with the initial statistics (up to eps), statistics unchanged.
        let f: Vec<f32> = frozen
            .forward(&x, true)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!((f[7] as f64 - 8.0 / (1.0f64 + 1e-5).sqrt()).abs() < 1e-5);
        let frm: Vec<f32> = store
            .get("frozen.running_mean")
            .unwrap()
            .as_tensor()
            .to_vec1()
            .unwrap();
        assert_eq!(frm, vec![0.0]);
        assert!(!frozen.uses_batch_statistics() && live.uses_batch_statistics());
    }
}

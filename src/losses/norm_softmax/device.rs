//! The normalised softmax's cross-entropy on a CUDA device in four launches: one op whose
//! forward pass reduces the `B × C` cosines to the mean cross-entropy and whose backward pass
//! writes their gradient, instead of candle's `log_softmax`, `gather` and mean with their
//! autograd (about 25 launches) and the division by the temperature.
//!
//! **Why.** At B = 256 a loss step is launch-bound. The normalised softmax is HAPPIER's
//! clustering term (λ = 0.1, one proxy per fine class), and HAPPIER was 0.91× PyTorch at B = 256
//! on the H200 (2026-11-26; the issue asks 3×); it is also the NSM baseline of HAPPIER's tables.
//! Here the kernels of `device.cu` beside this file compute, from `z` (the cosines; the ArcFace
//! logits with scale 1), the scale `s = 1/σ` and each row's target column `y_i`, in `f64`:
//!
//! ```text
//! parts (thread (i, k)):  over the columns c ≡ k (mod K): m_ik = max s z_ic, σ_ik = Σ exp(s z_ic − m_ik)
//! rows (thread i):        lse_i = M_i + log Σ_k σ_ik exp(m_ik − M_i),  M_i = max_k m_ik,
//!                         ℓ_i = lse_i − s z_{i,y_i}
//! total (one thread):     L = Σ_i ℓ_i / B                                     (HAPPIER Eq. 6)
//! gradient (i, j):        ∂L/∂z_ij = g s / B · (exp(s z_ij − lse_i) − [j = y_i])
//! ```
//!
//! with `K = min(C, 256)` lanes per row, so that a row of 11,318 classes (SOP's) is read by 256
//! threads in coalesced strides rather than by one. The log-sum-exps stay on the device between
//! the two passes (kept by the op), and the incoming gradient `g` is read there.
//!
//! **Tests.** The unit tests compile `device.cu` with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/softmax_ce.cpp`): the value and `∂L/∂z` equal to candle's
//! `cross_entropy` of `s z` and its autograd (f64 to 1e-13, f32 to its rounding), for any number
//! of lanes, extreme logits and a NaN; the GPU check compares the normalised softmax, HAPPIER with
//! its clustering term and the Σ over levels on CUDA with the CPU.

use crate::error::{Error, Result};
use candle_core::Tensor;

/// The most lanes (threads) that share one row's log-sum-exp.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
const MAX_LANES: usize = 256;

/// The lanes of a row of `c` columns: every lane has at least one column.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn lanes(c: usize) -> usize {
    c.clamp(1, MAX_LANES)
}

/// Whether the cross-entropy of `z` runs on the device kernels ([`crate::kernels::on_cuda`]).
pub(super) fn applies(z: &Tensor) -> bool {
    crate::kernels::on_cuda(z)
}

/// The mean softmax cross-entropy of the logits `scale · z` (`z`: `B × C`) against the target
/// column of each row, differentiable in `z` (see the module documentation).
pub(super) fn mean_cross_entropy(z: &Tensor, targets: Vec<u32>, scale: f64) -> Result<Tensor> {
    let (b, c) = z.dims2()?;
    if targets.len() != b {
        return Err(Error::Shape(format!(
            "{} targets for {b} rows of logits",
            targets.len()
        )));
    }
    if let Some((i, t)) = targets.iter().enumerate().find(|(_, &t)| t as usize >= c) {
        return Err(Error::invalid(
            "targets",
            format!("row {i}: target column {t} of {c}"),
        ));
    }
    run(z, targets, scale)
}

#[cfg(feature = "cuda")]
fn run(z: &Tensor, targets: Vec<u32>, scale: f64) -> Result<Tensor> {
    let loss = cuda::SoftmaxCe { targets, scale };
    Ok(crate::kernels::loss_op::apply(z, loss)?)
}

#[cfg(not(feature = "cuda"))]
fn run(_: &Tensor, _: Vec<u32>, _: f64) -> Result<Tensor> {
    Err(Error::invalid(
        "device",
        "the softmax cross-entropy's kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::lanes;
    use crate::kernels::loss_op::KernelLoss;
    use crate::kernels::{instance, per_entry, per_row, ptx, Float};
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::Layout;
    use std::sync::Arc;

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_softmax_ce";

    /// The mean cross-entropy of `scale · z` against each row's target column.
    pub(super) struct SoftmaxCe {
        pub(super) targets: Vec<u32>,
        pub(super) scale: f64,
    }

    /// What the forward pass leaves on the device: the target columns and the rows'
    /// log-sum-exps.
    #[derive(Clone)]
    pub(super) struct Saved {
        targets: Arc<CudaSlice<u32>>,
        lse: Arc<CudaSlice<f64>>,
    }

    impl KernelLoss for SoftmaxCe {
        type Saved = Saved;
        const NAME: &'static str = "rankwise-softmax-cross-entropy";
        const GRAD_NAME: &'static str = "rankwise-softmax-cross-entropy-grad";

        fn dims(&self, layout: &Layout) -> (usize, usize) {
            (
                self.targets.len(),
                layout.dims().get(1).copied().unwrap_or(0),
            )
        }

        fn forward<T: Float>(
            &self,
            dev: &CudaDevice,
            z: &CudaView<T>,
            (b, c): (usize, usize),
        ) -> candle_core::Result<(CudaSlice<T>, Saved)> {
            let k = lanes(c);
            let (nb, nc, nk) = (b as u64, c as u64, k as u64);
            let targets = dev.clone_htod(&self.targets)?;
            // SAFETY (the four allocations): the parts kernel writes all 2 B K partials, the
            // rows kernel the B log-sum-exps and row losses, the total kernel the loss, before
            // anything reads them.
            let mut partial = unsafe { dev.alloc::<f64>(2 * b * k)? };
            let mut lse = unsafe { dev.alloc::<f64>(b)? };
            let mut row_loss = unsafe { dev.alloc::<f64>(b)? };
            let mut loss = unsafe { dev.alloc::<T>(1)? };
            let func = |name: &str| {
                dev.get_or_load_custom_func(&instance::<T>(name), MODULE, ptx(MODULE, SOURCE)?)
            };
            let parts = func("rankwise_ce_parts")?;
            let mut l = parts.builder();
            l.arg(z)
                .arg(&mut partial)
                .arg(&nb)
                .arg(&nc)
                .arg(&nk)
                .arg(&self.scale);
            // SAFETY: `z` holds B × C values (checked by the op), `partial` 2 B K.
            unsafe { l.launch(per_entry(b, k)) }.w()?;
            let rows = func("rankwise_ce_rows")?;
            let mut l = rows.builder();
            l.arg(z)
                .arg(&partial)
                .arg(&targets)
                .arg(&mut lse)
                .arg(&mut row_loss)
                .arg(&nb)
                .arg(&nc)
                .arg(&nk)
                .arg(&self.scale);
            // SAFETY: as above; `targets`, `lse` and `row_loss` hold B values, each target < C.
            unsafe { l.launch(per_row(b)) }.w()?;
            let total = func("rankwise_ce_total")?;
            let mut l = total.builder();
            l.arg(&row_loss).arg(&mut loss).arg(&nb);
            // SAFETY: one thread reads the B row losses and writes the loss.
            unsafe { l.launch(per_row(1)) }.w()?;
            let saved = Saved {
                targets: Arc::new(targets),
                lse: Arc::new(lse),
            };
            Ok((loss, saved))
        }

        fn backward<T: Float>(
            &self,
            dev: &CudaDevice,
            z: &CudaView<T>,
            g: &CudaView<T>,
            saved: &Saved,
            (b, c): (usize, usize),
        ) -> candle_core::Result<CudaSlice<T>> {
            let (nb, nc) = (b as u64, c as u64);
            // SAFETY: the kernel writes every one of the B × C values.
            let mut dz = unsafe { dev.alloc::<T>(b * c)? };
            let grad = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_ce_grad"),
                MODULE,
                ptx(MODULE, SOURCE)?,
            )?;
            let mut l = grad.builder();
            l.arg(z)
                .arg(saved.targets.as_ref())
                .arg(saved.lse.as_ref())
                .arg(g)
                .arg(&mut dz)
                .arg(&nb)
                .arg(&nc)
                .arg(&self.scale);
            // SAFETY: `z` and `dz` hold B × C values, `targets` and `lse` B, `g` one.
            unsafe { l.launch(per_entry(b, c)) }.w()?;
            Ok(dz)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// What the harness returns: the loss, the rows' log-sum-exps, `g ∂L/∂z`.
    struct Emulated {
        loss: f64,
        lse: Vec<f64>,
        dz: Vec<f64>,
    }

    /// The kernels of `device.cu` run on the host by the harness (scrambled thread orders).
    fn emulate(
        z: &[f64],
        f32_z: bool,
        c: usize,
        k: usize,
        targets: &[u32],
        scale: f64,
        g: f64,
    ) -> Emulated {
        let b = targets.len();
        let mut input = Vec::new();
        for v in [b as u32, c as u32, k as u32, u32::from(f32_z)] {
            input.extend(v.to_le_bytes());
        }
        input.extend(scale.to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, z, f32_z);
        for &t in targets {
            input.extend(t.to_le_bytes());
        }
        crate::kernels::emulation::push_values(&mut input, &[g], f32_z);
        let out = crate::kernels::emulation::run("softmax_ce", &input);
        assert_eq!(out.len(), 1 + b + b * c);
        Emulated {
            loss: out[0],
            lse: out[1..1 + b].to_vec(),
            dz: out[1 + b..].to_vec(),
        }
    }

    /// candle's `cross_entropy` of `scale · z` (what the CPU runs) in `f64` on the values `z`
    /// (rounded to `f32` first when `f32_z`): the value and `g ∂L/∂z`.
    fn reference(
        z: &[f64],
        f32_z: bool,
        c: usize,
        targets: &[u32],
        scale: f64,
        g: f64,
    ) -> (f64, Vec<f64>) {
        let b = targets.len();
        let z: Vec<f64> = z
            .iter()
            .map(|&v| if f32_z { f64::from(v as f32) } else { v })
            .collect();
        let var = Var::from_vec(z, (b, c), &Device::Cpu).unwrap();
        let t = Tensor::from_vec(targets.to_vec(), b, &Device::Cpu).unwrap();
        let loss = candle_nn::loss::cross_entropy(&(var.as_tensor() * scale).unwrap(), &t).unwrap();
        let grads = loss.backward().unwrap();
        let dz = grads
            .get(&var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        (
            loss.to_scalar::<f64>().unwrap(),
            dz.into_iter().map(|d| g * d).collect(),
        )
    }

    fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-300);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale,
                "{what}[{i}]: {g} vs {w} (tolerance {tol} × {scale})"
            );
        }
    }

    /// `B × C` values: cosines in `[−1, 1)`, with ties in row 0 (its first two columns) and,
    /// when `C > 1`, a row whose logits reach ±800 at scale 20 (exp would overflow without the
    /// running maximum).
    fn values(b: usize, c: usize, seed: u64) -> Vec<f64> {
        let mut z: Vec<f64> = crate::kernels::emulation::uniform(b * c, seed)
            .into_iter()
            .map(|v| 2.0 * v)
            .collect();
        if c > 1 {
            z[1] = z[0];
            for j in 0..c {
                z[c + j] = if j % 2 == 0 { 40.0 } else { -40.0 } * (1.0 + j as f64 / c as f64);
            }
        }
        z
    }

    #[test]
    fn the_kernels_equal_candles_cross_entropy_for_any_number_of_lanes() {
        let b = 7;
        for c in [1usize, 4, 13] {
            let targets: Vec<u32> = (0..b as u32).map(|i| (i * 5 + 1) % c as u32).collect();
            let z = values(b, c, c as u64);
            let mut ks = vec![1, 3.min(c), c, lanes(c)];
            ks.dedup();
            for k in ks {
                for scale in [1.0, 20.0] {
                    for (f32_z, tol) in [(false, 1e-13), (true, 2e-7)] {
                        let g = 0.75;
                        let what = format!("C={c} K={k} s={scale} f32={f32_z}");
                        let got = emulate(&z, f32_z, c, k, &targets, scale, g);
                        let (value, dz) = reference(&z, f32_z, c, &targets, scale, g);
                        assert_close(&format!("{what}: loss"), &[got.loss], &[value], tol);
                        assert_close(&format!("{what}: ∂L/∂z"), &got.dz, &dz, tol);
                        assert!(
                            got.lse.iter().all(|v| v.is_finite()),
                            "{what}: {:?}",
                            got.lse
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_log_sum_exp_is_each_rows_own() {
        let (b, c) = (3, 5);
        let z = values(b, c, 11);
        let got = emulate(&z, false, c, 2, &[0, 1, 4], 20.0, 1.0);
        for i in 0..b {
            let row = &z[i * c..(i + 1) * c];
            let top = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(20.0 * v));
            let want = top
                + row
                    .iter()
                    .map(|&v| (20.0 * v - top).exp())
                    .sum::<f64>()
                    .ln();
            assert!((got.lse[i] - want).abs() <= 1e-12 * want.abs(), "row {i}");
        }
    }

    #[test]
    fn a_nan_logit_makes_the_loss_nan_as_on_the_cpu() {
        let (b, c) = (4, 6);
        let mut z = values(b, c, 3);
        z[2 * c + 3] = f64::NAN;
        let targets = [0, 1, 2, 3];
        let got = emulate(&z, false, c, 4, &targets, 20.0, 1.0);
        let (value, _) = reference(&z, false, c, &targets, 20.0, 1.0);
        assert!(got.loss.is_nan() && value.is_nan(), "{} {value}", got.loss);
    }

    #[test]
    fn targets_outside_the_logits_are_an_error_naming_the_row() {
        let z = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let err = mean_cross_entropy(&z, vec![0, 3], 20.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 1: target column 3 of 3"), "{err}");
        let err = mean_cross_entropy(&z, vec![0], 20.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 targets for 2 rows"), "{err}");
        assert!(!applies(&z));
    }

    #[test]
    fn lanes_cover_every_column() {
        assert_eq!(lanes(1), 1);
        assert_eq!(lanes(100), 100);
        assert_eq!(lanes(11_318), MAX_LANES);
    }
}

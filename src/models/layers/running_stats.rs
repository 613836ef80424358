//! BatchNorm's running averages updated in place on a CUDA device, by a kernel of their own
//! (`running_stats.cu` beside this file).
//!
//! **Why.** The tensor formulation of `μ ← (1 − m)μ + m·mean` and `σ² ← (1 − m)σ² +
//! m·var·n/(n − 1)` ([`super::BatchNorm2d`]'s `update_running_stats`) is six candle operations
//! and two copies into the variables per BatchNorm layer and training step, each a launch (and
//! all but the copies an allocation): 424 per ResNet-50 step. Here it is one launch per
//! statistic, writing the variable in place:
//!
//! ```text
//! running ← running · (1 − m) + batch · take        (take = m for the mean, m·n/(n − 1) for the variance)
//! ```
//!
//! with the tensor formulation's operations in its order, each rounded on its own, so the
//! values equal the CPU's bit for bit. On the cuDNN path the batch variance is not computed
//! beforehand (three more launches per layer): the kernel derives it from cuDNN's saved
//! `s = 1/√(σ² + ε)` as the tensor formulation would, `σ² = 1/s² − ε`.
//!
//! **Tests.** The unit test compiles the kernel with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/running_stats.cpp`) and compares it with the tensor
//! formulation exactly; the GPU check's model comparisons read the running averages after
//! their steps.

use crate::error::Result;
use candle_core::Tensor;

/// Whether `running` (a BatchNorm running average) is updated by the kernel:
/// [`crate::kernels::on_cuda`] and contiguous (a variable always is).
pub(super) fn applies(running: &Tensor) -> bool {
    crate::kernels::on_cuda(running) && running.is_contiguous()
}

/// The kernel's parameters (`struct rw_ema` of `running_stats.cu`, same layout).
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EmaParams {
    n: u64,
    keep: f64,
    take: f64,
    eps: f64,
    from_inv_std: i32,
    pad: i32,
}

impl EmaParams {
    /// `running ← running · keep + b · take` over `n` values, `b` the batch statistic, or the
    /// variance `1/s² − ε` of cuDNN's saved `s = 1/√(σ² + ε)` when `inv_std_eps` is `Some(ε)`.
    #[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
    fn new(n: usize, keep: f64, take: f64, inv_std_eps: Option<f64>) -> Self {
        EmaParams {
            n: n as u64,
            keep,
            take,
            eps: inv_std_eps.unwrap_or(0.0),
            from_inv_std: i32::from(inv_std_eps.is_some()),
            pad: 0,
        }
    }
}

/// `running ← running · keep + batch · take`, in place on the device; with `inv_std_eps =
/// Some(ε)`, `batch` is cuDNN's `1/√(σ² + ε)` and the variance `σ²` is derived in the kernel
/// (as the tensor formulation would: `1/s² − ε`).
#[cfg(feature = "cuda")]
pub(super) fn update(
    running: &Tensor,
    batch: &Tensor,
    keep: f64,
    take: f64,
    inv_std_eps: Option<f64>,
) -> Result<()> {
    let batch = batch.contiguous()?;
    let op = cuda::Ema(EmaParams::new(
        running.elem_count(),
        keep,
        take,
        inv_std_eps,
    ));
    running.inplace_op2(&batch, &op)?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
pub(super) fn update(_: &Tensor, _: &Tensor, _: f64, _: f64, _: Option<f64>) -> Result<()> {
    Err(crate::error::Error::invalid(
        "device",
        "the running-average kernel needs a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::EmaParams;
    use crate::kernels::{check_elementwise, dtype_error, instance, per_row, ptx, view, Float};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp2, Layout};

    const SOURCE: &str = include_str!("running_stats.cu");
    const MODULE: &str = "rankwise_running_stats";

    // SAFETY: `repr(C)` plain data with the layout of `struct rw_ema`.
    unsafe impl DeviceRepr for EmaParams {}

    /// The update of one running average: the destination in place, the batch statistic read.
    pub(super) struct Ema(pub(super) EmaParams);

    impl Ema {
        fn launch<T: Float>(
            &self,
            dst: &mut CudaStorage,
            dst_l: &Layout,
            batch: &CudaStorage,
            batch_l: &Layout,
        ) -> candle_core::Result<()> {
            let dev = dst.device().clone();
            let f = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_ema"),
                MODULE,
                ptx(MODULE, SOURCE)?,
            )?;
            let batch = view::<T>(batch, batch_l)?;
            let mut out = dst
                .as_cuda_slice_mut::<T>()?
                .slice_mut(dst_l.start_offset()..);
            let mut l = f.builder();
            l.arg(&mut out).arg(&batch).arg(&self.0);
            // SAFETY: both tensors hold `n` contiguous values (checked by `cuda_fwd`); the
            // kernel touches indices below `n` only.
            unsafe { l.launch(per_row(self.0.n as usize)) }.w()?;
            Ok(())
        }
    }

    impl InplaceOp2 for Ema {
        fn name(&self) -> &'static str {
            "rankwise-running-average"
        }

        fn cpu_fwd(
            &self,
            _: &mut CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<()> {
            Err(candle_core::Error::Msg(format!(
                "{} runs on a CUDA device; on the CPU BatchNorm takes its tensor formulation",
                self.name()
            )))
        }

        fn cuda_fwd(
            &self,
            dst: &mut CudaStorage,
            dst_l: &Layout,
            batch: &CudaStorage,
            batch_l: &Layout,
        ) -> candle_core::Result<()> {
            let dtype = check_elementwise(
                self.name(),
                self.0.n as usize,
                &[(&*dst, dst_l), (batch, batch_l)],
            )?;
            match dtype {
                DType::F32 => self.launch::<f32>(dst, dst_l, batch, batch_l),
                DType::F64 => self.launch::<f64>(dst, dst_l, batch, batch_l),
                d => Err(dtype_error(self.name(), d)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// The kernel run on the host by the harness (2 blocks of 3 threads): `running` after.
    fn emulate(f32_values: bool, running: &[f64], batch: &[f64], p: EmaParams) -> Vec<f64> {
        let mut input = Vec::new();
        input.extend(u32::from(f32_values).to_le_bytes());
        input.extend(p.n.to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, running, f32_values);
        crate::kernels::emulation::push_values(&mut input, batch, f32_values);
        input.extend(p.keep.to_le_bytes());
        input.extend(p.take.to_le_bytes());
        input.extend(p.eps.to_le_bytes());
        input.extend(p.from_inv_std.to_le_bytes());
        crate::kernels::emulation::run("running_stats", &input)
    }

    #[test]
    fn the_kernel_equals_the_tensor_formulation() {
        let n = 37;
        for dtype in [DType::F64, DType::F32] {
            let f32_values = dtype == DType::F32;
            let cast = |v: Vec<f64>| -> Vec<f64> {
                v.into_iter()
                    .map(|x| if f32_values { f64::from(x as f32) } else { x })
                    .collect()
            };
            let mut running = cast(crate::kernels::emulation::uniform(n, 4));
            for (step, (m, count)) in [(0.1, 64usize), (0.1, 2), (0.01, 1000), (1.0, 9)]
                .into_iter()
                .enumerate()
            {
                let batch = cast(
                    crate::kernels::emulation::uniform(n, 20 + step as u64)
                        .into_iter()
                        .map(|x| x * 1e3)
                        .collect(),
                );
                let unbias = count as f64 / (count - 1) as f64;
                // cuDNN's 1/√(σ² + ε) of a positive variance, for the derived-variance case.
                let inv_std = cast(
                    batch
                        .iter()
                        .map(|v| 1.0 / (v.abs() + 1e-5).sqrt())
                        .collect(),
                );
                let t = |v: &[f64]| {
                    Tensor::from_vec(v.to_vec(), n, &Device::Cpu)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                };
                for (take, inv_std_eps) in [(m, None), (m * unbias, None), (m * unbias, Some(1e-5))]
                {
                    // The tensor formulation, on the CPU: `running · (1 − m) + b · take`, `b` the
                    // batch statistic or the variance `s.sqr().recip() − ε` (the cuDNN path's).
                    let b = match inv_std_eps {
                        None => t(&batch),
                        Some(eps) => (t(&inv_std).sqr().unwrap().recip().unwrap() - eps).unwrap(),
                    };
                    let want: Vec<f64> = ((t(&running) * (1.0 - m)).unwrap() + (b * take).unwrap())
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_vec1()
                        .unwrap();
                    let p = EmaParams::new(n, 1.0 - m, take, inv_std_eps);
                    let given = if inv_std_eps.is_some() {
                        &inv_std
                    } else {
                        &batch
                    };
                    let got = emulate(f32_values, &running, given, p);
                    assert_eq!(
                        got, want,
                        "{dtype:?} step {step} take {take} {inv_std_eps:?}"
                    );
                    running = got;
                }
            }
        }
        assert_eq!(std::mem::size_of::<EmaParams>(), 40);
        let x = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        assert!(!applies(&x));
    }
}

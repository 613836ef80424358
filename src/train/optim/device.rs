//! The optimizers' updates on a CUDA device: each parameter and its state updated in place by
//! kernels of their own (`device.cu` beside this file), the same arithmetic as the tensor
//! formulation.
//!
//! **Why.** The tensor formulation of one Adam update ([`super::adam_update`]) is 14 to 16
//! candle operations per parameter — the lerp, the second moment, the square root, the bias
//! corrections, the division, the weight decay, the copy into the variable — and each is a
//! kernel launch, a fresh allocation and a host-side dispatch. A ResNet-50 has 161 parameter
//! tensors, so about 2,400 of them per step; the small CNN's whole step is a few milliseconds
//! in PyTorch, about what a few hundred such dispatches cost. Here an Adam / AdamW step is one
//! launch for all the parameters of a group (each value's first moment, second moment and
//! parameter in turn; the tensors' addresses and constants in a table uploaded with it, as
//! PyTorch's multi-tensor `foreach` updates), and an SGD update one or two launches per
//! parameter (momentum buffer, parameter), with no allocation of state after the first step:
//!
//! ```text
//! Adam:  g' = g + λθ (coupled decay)      m ← lerp(m, g', 1 − β₁)      v ← β₂v + ((1 − β₂)g') g'
//!        θ ← θ' + (m / (√v · (1/√(1 − β₂ᵗ)) + ε)) · (−lr / (1 − β₁ᵗ)),  θ' = θ(1 − lr λ) (AdamW)
//! SGD:   g' = g + λθ     b ← g' (first step) or μb + (1 − d)g'     θ ← θ + (g' + μb | b | g')(−lr)
//! ```
//!
//! Every operation is the tensor formulation's, in its order and rounded on its own (a scalar
//! product is candle's affine `x · (T)c + 0`), so an update on the device equals the CPU's
//! bit for bit — the CPU's being the one checked against PyTorch. The state tensors are
//! written in place, so [`super::Optimizer::state_tensors`] hands out copies.
//!
//! **Tests.** The unit tests compile `device.cu` with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/optim.cpp`) and compare several steps of every algorithm
//! and option with the tensor formulation on the CPU, exactly; the GPU check compares the
//! device's updates with the CPU's (`gpu_check`, entries `optimizer`).

use super::{AdamConfig, ParamState, SgdConfig};
use crate::error::Result;
use candle_core::Tensor;

/// Whether the update of `theta` runs on the kernels: [`crate::kernels::on_cuda`] and a
/// contiguous parameter (a variable always is).
pub(super) fn applies(theta: &Tensor) -> bool {
    crate::kernels::on_cuda(theta) && theta.is_contiguous()
}

/// The Adam kernels' parameters (`struct rw_adam` of `device.cu`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AdamParams {
    n: u64,
    wd: f64,
    lerp_mul: f64,
    beta2: f64,
    one_minus_beta2: f64,
    shrink: f64,
    inv_bc2_sqrt: f64,
    eps: f64,
    neg_step: f64,
    coupled: i32,
    decoupled: i32,
    lerp_hi: i32,
    pad: i32,
}

/// The SGD kernels' parameters (`struct rw_sgd` of `device.cu`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SgdParams {
    n: u64,
    wd: f64,
    momentum: f64,
    one_minus_dampening: f64,
    neg_lr: f64,
    coupled: i32,
    has_momentum: i32,
    nesterov: i32,
    first: i32,
}

/// Adam's constants for update number `step` (≥ 1) of an `n`-element parameter, computed in
/// `f64` as [`super::adam_update`] computes them.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) fn adam_params(
    n: usize,
    c: &AdamConfig,
    lr: f64,
    step: u64,
    decoupled: bool,
) -> AdamParams {
    let w = 1.0 - c.beta1;
    let step_i = step as i32;
    let bias_correction1 = 1.0 - c.beta1.powi(step_i);
    let bias_correction2 = 1.0 - c.beta2.powi(step_i);
    let decay = c.weight_decay != 0.0;
    AdamParams {
        n: n as u64,
        wd: c.weight_decay,
        lerp_mul: if w < 0.5 { w } else { 1.0 - w },
        beta2: c.beta2,
        one_minus_beta2: 1.0 - c.beta2,
        shrink: 1.0 - lr * c.weight_decay,
        // `Tensor / f64` is candle's affine with `1 / rhs`.
        inv_bc2_sqrt: 1.0 / bias_correction2.sqrt(),
        eps: c.eps,
        neg_step: -(lr / bias_correction1),
        coupled: i32::from(decay && !decoupled),
        decoupled: i32::from(decay && decoupled),
        lerp_hi: i32::from(w >= 0.5),
        pad: 0,
    }
}

/// `struct rw_adam`'s bytes as the kernels read them (`repr(C)`, little-endian): the
/// multi-tensor kernel's table and the emulation tests.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) fn adam_params_bytes(p: &AdamParams) -> Vec<u8> {
    let mut b = Vec::with_capacity(88);
    b.extend(p.n.to_le_bytes());
    for x in [
        p.wd,
        p.lerp_mul,
        p.beta2,
        p.one_minus_beta2,
        p.shrink,
        p.inv_bc2_sqrt,
        p.eps,
        p.neg_step,
    ] {
        b.extend(x.to_le_bytes());
    }
    for x in [p.coupled, p.decoupled, p.lerp_hi, p.pad] {
        b.extend(x.to_le_bytes());
    }
    b
}

/// SGD's constants for an `n`-element parameter; `first`: its momentum buffer is not yet set.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) fn sgd_params(n: usize, c: &SgdConfig, lr: f64, first: bool) -> SgdParams {
    SgdParams {
        n: n as u64,
        wd: c.weight_decay,
        momentum: c.momentum,
        one_minus_dampening: 1.0 - c.dampening,
        neg_lr: -lr,
        coupled: i32::from(c.weight_decay != 0.0),
        has_momentum: i32::from(c.momentum != 0.0),
        nesterov: i32::from(c.nesterov),
        first: i32::from(first),
    }
}

/// A state tensor of `theta`'s shape that this optimizer alone holds: the stored one, or zeros
/// (what the tensor formulation starts from) at the first step.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn state_buffer(slot: &mut Option<Tensor>, theta: &Tensor) -> Result<Tensor> {
    Ok(match slot {
        Some(t) if t.is_contiguous() => t.clone(),
        Some(t) => t.contiguous()?,
        None => theta.zeros_like()?,
    })
}

/// One Adam / AdamW update of every `(θ, gradient, state)` of `params` in place (each state
/// advanced, its `step` already counting this update): one launch per dtype and device among
/// them (the kernel's table holds addresses on one device, of one type).
#[cfg(feature = "cuda")]
pub(super) fn adam_step_many(
    params: Vec<(Tensor, Tensor, &mut ParamState)>,
    lr: f64,
    c: &AdamConfig,
    decoupled: bool,
) -> Result<()> {
    let mut groups: Vec<Vec<cuda::AdamTensor>> = Vec::new();
    for (theta, grad, state) in params {
        let grad = grad.contiguous()?;
        let m = state_buffer(&mut state.exp_avg, &theta)?;
        let v = state_buffer(&mut state.exp_avg_sq, &theta)?;
        let p = adam_params(theta.elem_count(), c, lr, state.step, decoupled);
        state.exp_avg = Some(m.clone());
        state.exp_avg_sq = Some(v.clone());
        let item = cuda::AdamTensor {
            theta,
            grad,
            m,
            v,
            p,
        };
        let same = |g: &&mut Vec<cuda::AdamTensor>| {
            let t = &g[0].theta;
            t.dtype() == item.theta.dtype() && t.device().same_device(item.theta.device())
        };
        match groups.iter_mut().find(same) {
            Some(items) => items.push(item),
            None => groups.push(vec![item]),
        }
    }
    for items in groups {
        cuda::adam_many(&items)?;
    }
    Ok(())
}

/// One SGD update of `theta` in place (its momentum buffer advanced).
#[cfg(feature = "cuda")]
pub(super) fn sgd_step(
    theta: &Tensor,
    grad: &Tensor,
    state: &mut ParamState,
    lr: f64,
    c: &SgdConfig,
) -> Result<()> {
    let grad = grad.contiguous()?;
    let p = sgd_params(theta.elem_count(), c, lr, state.momentum_buffer.is_none());
    if c.momentum == 0.0 {
        // The kernel reads no buffer without momentum: the gradient stands in for it.
        theta.inplace_op3(&grad, &grad, &cuda::Update::SgdTheta(p))?;
        return Ok(());
    }
    let b = state_buffer(&mut state.momentum_buffer, theta)?;
    b.inplace_op3(&grad, theta, &cuda::Update::SgdBuf(p))?;
    theta.inplace_op3(&grad, &b, &cuda::Update::SgdTheta(p))?;
    state.momentum_buffer = Some(b);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
pub(super) fn adam_step_many(
    _: Vec<(Tensor, Tensor, &mut ParamState)>,
    _: f64,
    _: &AdamConfig,
    _: bool,
) -> Result<()> {
    Err(crate::error::Error::invalid(
        "device",
        "the optimizer kernels need a build with the `cuda` feature",
    ))
}

#[cfg(not(feature = "cuda"))]
pub(super) fn sgd_step(
    _: &Tensor,
    _: &Tensor,
    _: &mut ParamState,
    _: f64,
    _: &SgdConfig,
) -> Result<()> {
    Err(crate::error::Error::invalid(
        "device",
        "the optimizer kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{AdamParams, SgdParams};
    use crate::kernels::{check_elementwise, dtype_error, instance, per_row, ptx, view, Float};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Storage, Tensor};

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_optim";

    // SAFETY: `repr(C)` plain data with the layout of `struct rw_adam`.
    unsafe impl DeviceRepr for AdamParams {}
    // SAFETY: `repr(C)` plain data with the layout of `struct rw_sgd`.
    unsafe impl DeviceRepr for SgdParams {}

    /// One parameter of a multi-tensor Adam update: its value, gradient and moments (contiguous,
    /// of one dtype, on one CUDA device) and its constants.
    pub(super) struct AdamTensor {
        pub(super) theta: Tensor,
        pub(super) grad: Tensor,
        pub(super) m: Tensor,
        pub(super) v: Tensor,
        pub(super) p: AdamParams,
    }

    /// Values per block of the multi-tensor kernel (256 threads, 64 values each).
    const CHUNK: u64 = 1 << 14;

    /// The device address of the first value of the contiguous CUDA tensor `t` of type `T`.
    fn address<T: Float>(t: &Tensor, what: &str) -> candle_core::Result<u64> {
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(s) = &*storage else {
            return Err(candle_core::Error::Msg(format!(
                "adam: the {what} is not on a CUDA device"
            )));
        };
        if !layout.is_contiguous() {
            return Err(candle_core::Error::Msg(format!(
                "adam: the {what} is not contiguous"
            )));
        }
        let stream = s.device().cuda_stream();
        let view = s.as_cuda_slice::<T>()?.slice(layout.start_offset()..);
        let (ptr, _record) = view.device_ptr(&stream);
        Ok(ptr)
    }

    /// One launch of `rankwise_adam_many` over `items` (one dtype, one device, at least one
    /// item): the table of
    /// `struct rw_adam_tensor` and the blocks' `(tensor, start)` uploaded with it. The kernel
    /// writes the values, moments through their addresses: the tensors are kept alive by the
    /// optimizer (θ, m, v) and the gradient store, and freed, when they are, in stream order.
    pub(super) fn adam_many(items: &[AdamTensor]) -> crate::error::Result<()> {
        let Some(first) = items.first() else {
            return Ok(());
        };
        let dtype = first.theta.dtype();
        match dtype {
            DType::F32 => launch_many::<f32>(items, dtype),
            DType::F64 => launch_many::<f64>(items, dtype),
            d => Err(dtype_error("adam", d).into()),
        }
    }

    fn launch_many<T: Float>(items: &[AdamTensor], dtype: DType) -> crate::error::Result<()> {
        let mut table: Vec<u8> = Vec::with_capacity(items.len() * 120);
        let mut blocks: Vec<u64> = Vec::new();
        for (k, it) in items.iter().enumerate() {
            let n = it.p.n;
            for (t, what) in [
                (&it.theta, "parameter"),
                (&it.grad, "gradient"),
                (&it.m, "first moment"),
                (&it.v, "second moment"),
            ] {
                if t.dtype() != dtype || t.elem_count() as u64 != n {
                    return Err(candle_core::Error::Msg(format!(
                        "adam: the {what} of tensor {k} is {:?} {:?}, expected {n} {dtype:?} values",
                        t.dtype(),
                        t.dims(),
                    ))
                    .into());
                }
                table.extend(address::<T>(t, what)?.to_le_bytes());
            }
            table.extend(super::adam_params_bytes(&it.p));
            let mut start = 0;
            while start < n {
                blocks.extend([k as u64, start]);
                start += CHUNK;
            }
        }
        if blocks.is_empty() {
            return Ok(());
        }
        let dev = items[0].theta.device().as_cuda_device()?;
        let count = blocks.len() / 2;
        if count > i32::MAX as usize {
            return Err(candle_core::Error::Msg(format!(
                "adam: {count} blocks, more than one launch's grid"
            ))
            .into());
        }
        let table = dev.clone_htod(&table)?;
        let blocks = dev.clone_htod(&blocks)?;
        let f = dev.get_or_load_custom_func(
            &instance::<T>("rankwise_adam_many"),
            MODULE,
            ptx(MODULE, SOURCE)?,
        )?;
        let chunk = CHUNK;
        let mut l = f.builder();
        l.arg(&table).arg(&blocks).arg(&chunk);
        let cfg = LaunchConfig {
            grid_dim: (count as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the table holds, for each tensor, four addresses of `p.n` contiguous values
        // of `T` (checked above) and its constants; each block reads one entry of `blocks`,
        // whose tensor index and start lie within the table and the tensor.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }

    /// One kernel of an SGD update: the destination is written in place, the two sources read.
    pub(super) enum Update {
        /// `b` ← (g, θ).
        SgdBuf(SgdParams),
        /// `θ` ← (g, b).
        SgdTheta(SgdParams),
    }

    impl Update {
        fn kernel(&self) -> &'static str {
            match self {
                Update::SgdBuf(_) => "rankwise_sgd_buf",
                Update::SgdTheta(_) => "rankwise_sgd_theta",
            }
        }

        fn n(&self) -> u64 {
            match self {
                Update::SgdBuf(p) | Update::SgdTheta(p) => p.n,
            }
        }

        fn launch<T: Float>(
            &self,
            dst: &mut CudaStorage,
            dst_l: &Layout,
            a: (&CudaStorage, &Layout),
            b: (&CudaStorage, &Layout),
        ) -> candle_core::Result<()> {
            let dev = dst.device().clone();
            let f = dev.get_or_load_custom_func(&instance::<T>(self.kernel()), MODULE, {
                ptx(MODULE, SOURCE)?
            })?;
            let a = view::<T>(a.0, a.1)?;
            let b = view::<T>(b.0, b.1)?;
            let mut out = dst
                .as_cuda_slice_mut::<T>()?
                .slice_mut(dst_l.start_offset()..);
            let mut l = f.builder();
            l.arg(&mut out).arg(&a).arg(&b);
            match self {
                Update::SgdBuf(p) | Update::SgdTheta(p) => l.arg(p),
            };
            // SAFETY: the destination and both sources hold `n` contiguous values (checked by
            // `cuda_fwd`); the kernels touch indices below `n` only.
            unsafe { l.launch(per_row(self.n() as usize)) }.w()?;
            Ok(())
        }
    }

    impl InplaceOp3 for Update {
        fn name(&self) -> &'static str {
            "rankwise-optimizer-update"
        }

        fn cpu_fwd(
            &self,
            _: &mut CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<()> {
            Err(candle_core::Error::Msg(format!(
                "{} runs on a CUDA device; on the CPU the optimizer takes its tensor formulation",
                self.name()
            )))
        }

        fn cuda_fwd(
            &self,
            dst: &mut CudaStorage,
            dst_l: &Layout,
            a: &CudaStorage,
            a_l: &Layout,
            b: &CudaStorage,
            b_l: &Layout,
        ) -> candle_core::Result<()> {
            let dtype = check_elementwise(
                self.name(),
                self.n() as usize,
                &[(&*dst, dst_l), (a, a_l), (b, b_l)],
            )?;
            match dtype {
                DType::F32 => self.launch::<f32>(dst, dst_l, (a, a_l), (b, b_l)),
                DType::F64 => self.launch::<f64>(dst, dst_l, (a, a_l), (b, b_l)),
                d => Err(dtype_error(self.name(), d)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{adam_update, sgd_update};
    use super::*;
    use candle_core::{DType, Device};

    /// Runs one update's kernels of `device.cu` on the host (the harness, blocks of 3 threads):
    /// `(θ, first buffer, second buffer)` after the update; the buffers are `(m, v)` for Adam,
    /// `(b, —)` for SGD.
    fn emulate(
        update: Emulated,
        f32_values: bool,
        theta: &[f64],
        grad: &[f64],
        buffers: (&[f64], &[f64]),
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let n = theta.len();
        let mut input = Vec::new();
        let (kind, bytes) = match update {
            Emulated::Adam(p) => (0u32, adam_bytes(&p)),
            Emulated::Sgd(p) => (1u32, sgd_bytes(&p)),
        };
        input.extend(kind.to_le_bytes());
        input.extend(u32::from(f32_values).to_le_bytes());
        input.extend((n as u64).to_le_bytes());
        for values in [theta, grad, buffers.0, buffers.1] {
            crate::kernels::emulation::push_values(&mut input, values, f32_values);
        }
        input.extend(bytes);
        let out = crate::kernels::emulation::run("optim", &input);
        assert_eq!(out.len(), 3 * n);
        (
            out[..n].to_vec(),
            out[n..2 * n].to_vec(),
            out[2 * n..].to_vec(),
        )
    }

    #[derive(Clone, Copy)]
    enum Emulated {
        Adam(AdamParams),
        Sgd(SgdParams),
    }

    fn adam_bytes(p: &AdamParams) -> Vec<u8> {
        let b = adam_params_bytes(p);
        assert_eq!(b.len(), std::mem::size_of::<AdamParams>());
        b
    }

    fn sgd_bytes(p: &SgdParams) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(p.n.to_le_bytes());
        for x in [p.wd, p.momentum, p.one_minus_dampening, p.neg_lr] {
            b.extend(x.to_le_bytes());
        }
        for x in [p.coupled, p.has_momentum, p.nesterov, p.first] {
            b.extend(x.to_le_bytes());
        }
        assert_eq!(b.len(), std::mem::size_of::<SgdParams>());
        b
    }

    fn values(t: &Option<Tensor>, n: usize) -> Vec<f64> {
        match t {
            Some(t) => t.to_dtype(DType::F64).unwrap().to_vec1().unwrap(),
            None => vec![0.0; n],
        }
    }

    /// Gradients of every magnitude, with exact zeros and a signed zero: the cases where a
    /// contracted or reordered operation would show in the last bit.
    fn gradient(n: usize, seed: u64) -> Vec<f64> {
        let u = crate::kernels::emulation::uniform(n, seed);
        u.iter()
            .enumerate()
            .map(|(i, &x)| match i % 7 {
                0 => 0.0,
                1 => -0.0,
                2 => x * 1e-6,
                3 => x * 1e3,
                _ => x,
            })
            .collect()
    }

    /// `steps` updates by the kernels and by the tensor formulation on the CPU, from the same
    /// parameter, gradients and state: every value equal after every step.
    fn compare(algorithm: super::super::Algorithm, dtype: DType, steps: u64) {
        use super::super::Algorithm;
        let n = 41; // not a multiple of the blocks of 3: bounds exercised
        let f32_values = dtype == DType::F32;
        let cast = |v: Vec<f64>| -> Vec<f64> {
            if f32_values {
                v.into_iter().map(|x| f64::from(x as f32)).collect()
            } else {
                v
            }
        };
        let mut theta = cast(crate::kernels::emulation::uniform(n, 3));
        let mut state = ParamState::default();
        let (mut buf0, mut buf1) = (vec![0.0; n], vec![0.0; n]);
        let lr = 0.01;
        for step in 1..=steps {
            let grad = cast(gradient(n, 10 + step));
            let t = Tensor::from_vec(theta.clone(), n, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let g = Tensor::from_vec(grad.clone(), n, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            state.step = step;
            let (emulated, want) = match algorithm {
                Algorithm::Adam(c) | Algorithm::AdamW(c) => {
                    let decoupled = matches!(algorithm, Algorithm::AdamW(_));
                    let p = adam_params(n, &c, lr, step, decoupled);
                    let e = emulate(Emulated::Adam(p), f32_values, &theta, &grad, (&buf0, &buf1));
                    let new = adam_update(&t, &g, &mut state, lr, &c, decoupled).unwrap();
                    (
                        e,
                        (new, values(&state.exp_avg, n), values(&state.exp_avg_sq, n)),
                    )
                }
                Algorithm::Sgd(c) => {
                    let first = state.momentum_buffer.is_none();
                    let p = sgd_params(n, &c, lr, first);
                    let e = emulate(Emulated::Sgd(p), f32_values, &theta, &grad, (&buf0, &buf1));
                    let new = sgd_update(&t, &g, &mut state, lr, &c).unwrap();
                    let b = if c.momentum == 0.0 {
                        // No buffer: the harness leaves its input as it was.
                        buf0.clone()
                    } else {
                        values(&state.momentum_buffer, n)
                    };
                    (e, (new, b, buf1.clone()))
                }
            };
            let want_theta: Vec<f64> = want.0.to_dtype(DType::F64).unwrap().to_vec1().unwrap();
            let what = format!("{algorithm:?} {dtype:?} step {step}");
            for (name, got, want) in [
                ("θ", &emulated.0, &want_theta),
                ("buffer 1", &emulated.1, &want.1),
                ("buffer 2", &emulated.2, &want.2),
            ] {
                for i in 0..n {
                    assert!(
                        got[i] == want[i],
                        "{what}: {name}[{i}] = {} on the kernels, {} on the CPU",
                        got[i],
                        want[i]
                    );
                }
            }
            assert!(
                want_theta.iter().zip(&theta).any(|(a, b)| a != b),
                "{what}: no parameter moved"
            );
            (theta, buf0, buf1) = emulated;
        }
    }

    #[test]
    fn the_kernels_equal_the_tensor_formulation_for_every_algorithm() {
        use super::super::Algorithm;
        let adam = AdamConfig::default();
        let decay = AdamConfig {
            weight_decay: 0.05,
            ..adam
        };
        // β₁ ≤ 0.5 takes PyTorch's other form of the lerp.
        let low_beta = AdamConfig {
            beta1: 0.3,
            beta2: 0.5,
            eps: 1e-3,
            weight_decay: 0.01,
        };
        let sgd = SgdConfig::default();
        let momentum = SgdConfig {
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 1e-4,
            nesterov: false,
        };
        let nesterov = SgdConfig {
            momentum: 0.9,
            nesterov: true,
            ..SgdConfig::default()
        };
        let decay_only = SgdConfig {
            weight_decay: 5e-4,
            ..SgdConfig::default()
        };
        for algorithm in [
            Algorithm::Adam(adam),
            Algorithm::Adam(decay),
            Algorithm::Adam(low_beta),
            Algorithm::AdamW(adam),
            Algorithm::AdamW(decay),
            Algorithm::AdamW(low_beta),
            Algorithm::Sgd(sgd),
            Algorithm::Sgd(momentum),
            Algorithm::Sgd(nesterov),
            Algorithm::Sgd(decay_only),
        ] {
            for dtype in [DType::F64, DType::F32] {
                compare(algorithm, dtype, 4);
            }
        }
    }

    #[test]
    fn the_constants_follow_the_options() {
        let p = adam_params(5, &AdamConfig::default(), 0.1, 1, false);
        assert_eq!((p.coupled, p.decoupled, p.lerp_hi), (0, 0, 0));
        assert!((p.lerp_mul - 0.1).abs() < 1e-15);
        assert!((p.neg_step + 1.0).abs() < 1e-12, "{}", p.neg_step);
        let c = AdamConfig {
            weight_decay: 0.1,
            beta1: 0.2,
            ..AdamConfig::default()
        };
        let p = adam_params(5, &c, 0.1, 3, true);
        assert_eq!((p.coupled, p.decoupled, p.lerp_hi), (0, 1, 1));
        assert!((p.lerp_mul - 0.2).abs() < 1e-15);
        assert_eq!(adam_params(5, &c, 0.1, 3, false).coupled, 1);
        let s = sgd_params(7, &SgdConfig::default(), 0.5, true);
        assert_eq!(
            (s.coupled, s.has_momentum, s.nesterov, s.first),
            (0, 0, 0, 1)
        );
        assert_eq!(s.neg_lr, -0.5);
        assert_eq!(std::mem::size_of::<AdamParams>(), 88);
        assert_eq!(std::mem::size_of::<SgdParams>(), 56);
        let x = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        assert!(!applies(&x));
    }
}

//! The models' ReLU on a CUDA device, by kernels of its own (`relu.cu` beside this file): the
//! ReLU, and a ResNet block's residual sum and ReLU in one pass.
//!
//! **Why.** candle's ReLU keeps its input for the backward pass and differentiates it as
//! `∂y · (x ≥ 0)` through four operations — a zero tensor, a comparison, a cast and a product,
//! each an activation-sized allocation — and a block's `relu(bn + residual)` adds a sum whose
//! output is one more activation kept for the backward pass. Here the forward is one launch
//! (the sum and the ReLU together at a block's end) and the backward one launch, reading the
//! output:
//!
//! ```text
//! y = max(x, 0)    (a + b for a block's end)          ∂x = ∂y where y > 0, else 0    (both ∂a, ∂b)
//! ```
//!
//! which is PyTorch's `threshold_backward` and the CPU's fused ops (`models::cpu_ops`); candle's
//! ReLU passes the gradient where the input is ≥ 0, so the two differ only at an exact zero.
//!
//! **Tests.** The unit test compiles the kernels with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/relu.cpp`) and compares them with the CPU's definitions,
//! zeros and a NaN included; the GPU check's model comparisons run them through every network.

use crate::error::Result;
use candle_core::Tensor;

/// Whether `x` takes the kernels: [`crate::kernels::on_cuda`], and not empty (no launch of an
/// empty grid).
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn applies(x: &Tensor) -> bool {
    crate::kernels::on_cuda(x) && x.elem_count() > 0
}

/// `max(x, 0)`: by the kernels on a CUDA device, else candle's ReLU.
pub(super) fn relu(x: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if applies(x) {
        let x = x.contiguous()?;
        return Ok(if x.track_op() {
            x.apply_op1(cuda::Relu)?
        } else {
            x.apply_op1_no_bwd(&cuda::Relu)?
        });
    }
    Ok(x.relu()?)
}

/// `max(a + b, 0)` (a ResNet block's end): by one kernel on a CUDA device, else candle's sum
/// and ReLU.
pub(super) fn add_relu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if applies(a) && a.dtype() == b.dtype() && a.dims() == b.dims() {
        let (a, b) = (a.contiguous()?, b.contiguous()?);
        return Ok(if a.track_op() || b.track_op() {
            a.apply_op2(&b, cuda::AddRelu)?
        } else {
            a.apply_op2_no_bwd(&b, &cuda::AddRelu)?
        });
    }
    Ok((a + b)?.relu()?)
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::kernels::{check_elementwise, run_into_new};
    use candle_core::{CpuStorage, CudaStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

    const SOURCE: &str = include_str!("relu.cu");
    const MODULE: &str = "rankwise_relu";

    fn not_on_cpu(name: &str) -> candle_core::Error {
        candle_core::Error::Msg(format!(
            "{name} runs on a CUDA device; on the CPU the models take their fused ops"
        ))
    }

    /// `kernel(inputs…, out, n)` over the `n` values of same-dtype contiguous storages, one
    /// thread per value, into a new buffer.
    fn run(
        name: &str,
        kernel: &str,
        inputs: &[(&CudaStorage, &Layout)],
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let shape = inputs[0].1.shape().clone();
        let n = shape.elem_count();
        check_elementwise(name, n, inputs)?;
        let out = run_into_new(name, (MODULE, SOURCE), kernel, inputs, n, &[n as u64], n)?;
        Ok((out, shape))
    }

    /// `∂y` where `y > 0`, else 0: the gradient through a ReLU from its output.
    fn relu_grad(y: &Tensor, grad: &Tensor) -> candle_core::Result<Tensor> {
        y.apply_op2_no_bwd(&grad.contiguous()?, &ReluGrad)
    }

    pub(super) struct Relu;

    impl CustomOp1 for Relu {
        fn name(&self) -> &'static str {
            "rankwise-relu"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
            Err(not_on_cpu(self.name()))
        }

        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            l: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            run(self.name(), "rankwise_relu", &[(x, l)])
        }

        fn bwd(
            &self,
            _x: &Tensor,
            y: &Tensor,
            grad: &Tensor,
        ) -> candle_core::Result<Option<Tensor>> {
            relu_grad(y, grad).map(Some)
        }
    }

    pub(super) struct AddRelu;

    impl CustomOp2 for AddRelu {
        fn name(&self) -> &'static str {
            "rankwise-add-relu"
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
            a: &CudaStorage,
            al: &Layout,
            b: &CudaStorage,
            bl: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            run(self.name(), "rankwise_add_relu", &[(a, al), (b, bl)])
        }

        fn bwd(
            &self,
            _a: &Tensor,
            _b: &Tensor,
            y: &Tensor,
            grad: &Tensor,
        ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
            // Both summands receive the same gradient (one tensor, shared).
            let g = relu_grad(y, grad)?;
            Ok((Some(g.clone()), Some(g)))
        }
    }

    struct ReluGrad;

    impl CustomOp2 for ReluGrad {
        fn name(&self) -> &'static str {
            "rankwise-relu-grad"
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
            y: &CudaStorage,
            yl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            run(self.name(), "rankwise_relu_grad", &[(y, yl), (g, gl)])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// The three kernels run on the host by the harness: `(relu(a), relu(a + b), ∂ from y = b)`
    /// (the gradient kernel reads `b` as the output and `a` as the incoming gradient).
    fn emulate(f32_values: bool, a: &[f64], b: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let n = a.len();
        let mut input = Vec::new();
        input.extend(u32::from(f32_values).to_le_bytes());
        input.extend((n as u64).to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, a, f32_values);
        crate::kernels::emulation::push_values(&mut input, b, f32_values);
        let out = crate::kernels::emulation::run("relu", &input);
        assert_eq!(out.len(), 3 * n);
        (
            out[..n].to_vec(),
            out[n..2 * n].to_vec(),
            out[2 * n..].to_vec(),
        )
    }

    /// Equal, NaN equal to NaN, and the same sign of zero.
    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || (a == b && a.is_sign_negative() == b.is_sign_negative())
    }

    #[test]
    fn the_kernels_follow_the_cpu_definitions() {
        let mut a = crate::kernels::emulation::uniform(29, 5);
        let mut b = crate::kernels::emulation::uniform(29, 6);
        // Exact zeros of both signs, a sum that is exactly zero, a NaN.
        a[0] = 0.0;
        a[1] = -0.0;
        b[2] = -a[2];
        a[3] = f64::NAN;
        b[4] = 0.0;
        b[5] = -0.0;
        for f32_values in [false, true] {
            let cast = |v: &[f64]| -> Vec<f64> {
                v.iter()
                    .map(|&x| if f32_values { f64::from(x as f32) } else { x })
                    .collect()
            };
            let (a, b) = (cast(&a), cast(&b));
            let (relu_a, relu_sum, grad) = emulate(f32_values, &a, &b);
            let cut = |v: f64| if v < 0.0 { 0.0 } else { v };
            for i in 0..a.len() {
                let sum = if f32_values {
                    f64::from(a[i] as f32 + b[i] as f32)
                } else {
                    a[i] + b[i]
                };
                assert!(same(relu_a[i], cut(a[i])), "relu[{i}] {}", relu_a[i]);
                assert!(same(relu_sum[i], cut(sum)), "add_relu[{i}] {}", relu_sum[i]);
                let want = if b[i] > 0.0 { a[i] } else { 0.0 };
                assert!(same(grad[i], want), "grad[{i}] {} vs {want}", grad[i]);
            }
        }
    }

    #[test]
    fn off_a_cuda_device_the_functions_are_candles() {
        let a = Tensor::new(&[-1.0f32, 0.0, 2.0], &Device::Cpu).unwrap();
        let b = Tensor::new(&[0.5f32, -1.0, -3.0], &Device::Cpu).unwrap();
        assert_eq!(
            relu(&a).unwrap().to_vec1::<f32>().unwrap(),
            vec![0.0, 0.0, 2.0]
        );
        assert_eq!(
            add_relu(&a, &b).unwrap().to_vec1::<f32>().unwrap(),
            vec![0.0, 0.0, 0.0]
        );
        assert!(!applies(&a.to_dtype(DType::F64).unwrap()));
    }
}

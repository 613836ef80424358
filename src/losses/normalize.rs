//! The losses' L2 normalisation on a CUDA device: `ê = x / ‖x‖` from the row norms by one
//! kernel, and its whole gradient by another (`normalize/device.cu`):
//!
//! ```text
//! ∂x_i = (g_i − ê_i (ê_i · g_i)) / ‖x_i‖        (g = ∂loss/∂ê)
//! ```
//!
//! **Why.** Every loss normalises its batch (and the proxy losses their proxies) once per step.
//! candle's autograd of `x / sqrt(Σ x²)` differentiates the division (both operands), the square
//! root, the sum's broadcast and the square, and adds the two paths into `x`: about a dozen
//! launches, each an allocation and a host-side dispatch, where the loss at B = 256 has a
//! budget of a few dozen (the issue's target: 3× PyTorch). Here the norms go in detached and the
//! backward pass is one launch. The forward values are candle's bit for bit (the same correctly
//! rounded division); the gradient is the same function, rounded in another order.
//!
//! **Tests.** The unit tests compile the kernels with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/normalize.cpp`): the division equal to candle's, the
//! gradient equal to the formula above computed in the same order, and that formula equal to
//! candle's autograd; the GPU check's loss comparisons run it in every loss.

use crate::error::Result;
use candle_core::Tensor;

/// `rows / norms` (`B × D` by `B × 1`) with the gradient above, on a CUDA device with the
/// kernels on; `None` elsewhere (the caller divides with candle). `norms` must be the rows'
/// norms: the gradient assumes it.
pub(crate) fn unit_rows(rows: &Tensor, norms: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if crate::kernels::on_cuda(rows) && rows.elem_count() > 0 && norms.dtype() == rows.dtype() {
        let (x, n) = (rows.contiguous()?, norms.detach().contiguous()?);
        return Ok(Some(if x.track_op() {
            x.apply_op2(&n, cuda::UnitRows)?
        } else {
            x.apply_op2_no_bwd(&n, &cuda::UnitRows)?
        }));
    }
    let _ = (rows, norms);
    Ok(None)
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::kernels::{check_matrix, not_on_cpu, run_into_new};
    use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};

    const SOURCE: &str = include_str!("normalize/device.cu");
    const MODULE: &str = "rankwise_normalize";

    /// `x / n` row by row; its backward pass is [`UnitRowsGrad`].
    pub(super) struct UnitRows;

    /// `(g − y (y · g)) / n` row by row, from `y = x / n`, `n` and `g`.
    struct UnitRowsGrad;

    /// `(rows, d)` of a contiguous matrix and its `rows × 1` norms.
    fn dims(op: &str, x: &Layout, n: &Layout) -> candle_core::Result<(usize, usize)> {
        let (rows, d) = match x.dims() {
            [r, d] => (*r, *d),
            other => {
                return Err(candle_core::Error::Msg(format!(
                    "{op}: a B × D matrix expected, got {other:?}"
                )))
            }
        };
        check_matrix(op, x, rows, d)?;
        check_matrix(op, n, rows, 1)?;
        Ok((rows, d))
    }

    /// `kernel(inputs…, out, rows, d)` on `threads` threads into a new `rows × d` matrix.
    fn run(
        op: &str,
        kernel: &str,
        inputs: &[(&CudaStorage, &Layout)],
        rows: usize,
        d: usize,
        threads: usize,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        if rows * d > u32::MAX as usize {
            return Err(candle_core::Error::Msg(format!(
                "{op}: {rows} × {d} values, more than the kernels' 32-bit launch grid"
            )));
        }
        let scalars = [rows as u64, d as u64];
        // The kernels read the matrices' `rows × d` values and the norms' `rows` (checked by
        // the callers) and write every value of the output.
        let out = run_into_new(
            op,
            (MODULE, SOURCE),
            kernel,
            inputs,
            rows * d,
            &scalars,
            threads,
        )?;
        Ok((out, Shape::from((rows, d))))
    }

    impl CustomOp2 for UnitRows {
        fn name(&self) -> &'static str {
            "rankwise-unit-rows"
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
            x: &CudaStorage,
            xl: &Layout,
            n: &CudaStorage,
            nl: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let (rows, d) = dims(self.name(), xl, nl)?;
            run(
                self.name(),
                "rankwise_unit_rows",
                &[(x, xl), (n, nl)],
                rows,
                d,
                rows * d,
            )
        }

        fn bwd(
            &self,
            _x: &Tensor,
            n: &Tensor,
            y: &Tensor,
            grad: &Tensor,
        ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
            // The norms came in detached: the whole gradient goes to `x`.
            let dx = y.apply_op3_no_bwd(n, &grad.contiguous()?, &UnitRowsGrad)?;
            Ok((Some(dx), None))
        }
    }

    impl CustomOp3 for UnitRowsGrad {
        fn name(&self) -> &'static str {
            "rankwise-unit-rows-grad"
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
            y: &CudaStorage,
            yl: &Layout,
            n: &CudaStorage,
            nl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let (rows, d) = dims(self.name(), yl, nl)?;
            check_matrix(self.name(), gl, rows, d)?;
            run(
                self.name(),
                "rankwise_unit_rows_grad",
                &[(y, yl), (n, nl), (g, gl)],
                rows,
                d,
                rows,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor, Var};

    /// The kernels run on the host by the harness: `(x / n, dx)` for `rows × d` values.
    fn emulate(
        f32_values: bool,
        x: &[f64],
        n: &[f64],
        g: &[f64],
        d: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let rows = n.len();
        let mut input = Vec::new();
        input.extend(u32::from(f32_values).to_le_bytes());
        input.extend((rows as u64).to_le_bytes());
        input.extend((d as u64).to_le_bytes());
        for v in [x, n, g] {
            crate::kernels::emulation::push_values(&mut input, v, f32_values);
        }
        let out = crate::kernels::emulation::run("normalize", &input);
        assert_eq!(out.len(), 2 * rows * d);
        (out[..rows * d].to_vec(), out[rows * d..].to_vec())
    }

    /// The row norms as `l2_normalize` computes them (candle, in the values' dtype), as f64.
    fn norms(x: &Tensor) -> Vec<f64> {
        x.sqr()
            .unwrap()
            .sum_keepdim(1)
            .unwrap()
            .sqrt()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// The division is candle's bit for bit; the gradient is `(g − y (y·g)) / n` computed in the
    /// kernel's order and dtype, bit for bit (the host compiler contracts no product into an
    /// FMA in ISO C++); rows of 1 and 7 values, 5 rows (not a multiple of the emulated grid).
    #[test]
    fn the_kernels_divide_as_candle_and_differentiate_as_the_formula() {
        for f32_values in [false, true] {
            for d in [1usize, 7] {
                let rows = 5;
                let raw = crate::kernels::emulation::uniform(rows * d, d as u64);
                let g = crate::kernels::emulation::uniform(rows * d, 40 + d as u64);
                let dtype = if f32_values { DType::F32 } else { DType::F64 };
                let x = Tensor::from_vec(raw, (rows, d), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let g = Tensor::from_vec(g, (rows, d), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let n = norms(&x);
                let (xv, gv) = (values(&x), values(&g));
                let (y, dx) = emulate(f32_values, &xv, &n, &gv, d);
                let n_t = Tensor::from_vec(n.clone(), (rows, 1), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                assert_eq!(
                    y,
                    values(&x.broadcast_div(&n_t).unwrap()),
                    "f32 {f32_values}"
                );
                // The formula in the kernel's order and dtype.
                let round = |v: f64| if f32_values { f64::from(v as f32) } else { v };
                for r in 0..rows {
                    let (yr, gr) = (&y[r * d..(r + 1) * d], &gv[r * d..(r + 1) * d]);
                    let mut dot = 0.0;
                    for j in 0..d {
                        dot = round(dot + round(yr[j] * gr[j]));
                    }
                    for j in 0..d {
                        let want = round(round(gr[j] - round(yr[j] * dot)) / n[r]);
                        assert_eq!(dx[r * d + j], want, "row {r}, {j}, f32 {f32_values}");
                    }
                }
            }
        }
    }

    /// The formula is the gradient of `x / ‖x‖`: candle's autograd of it, in f64.
    #[test]
    fn the_formula_is_the_gradient_of_the_normalisation() {
        let (rows, d) = (4, 6);
        let x = Var::from_vec(
            crate::kernels::emulation::uniform(rows * d, 3),
            (rows, d),
            &Device::Cpu,
        )
        .unwrap();
        let g = crate::kernels::emulation::uniform(rows * d, 4);
        let gt = Tensor::from_vec(g.clone(), (rows, d), &Device::Cpu).unwrap();
        let y = crate::losses::l2_normalize(x.as_tensor(), "x").unwrap();
        let grads = (&y * &gt).unwrap().sum_all().unwrap().backward().unwrap();
        let want = values(grads.get(&x).unwrap());
        let n = norms(x.as_tensor());
        let (yv, dx) = emulate(false, &values(x.as_tensor()), &n, &g, d);
        assert_eq!(yv, values(&y));
        for (a, b) in dx.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }
}

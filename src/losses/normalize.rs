//! The losses' L2 normalisation `ê = x / ‖x‖`, given the row norms, as one op whose backward
//! pass is one op too, on the CPU and on a CUDA device:
//!
//! ```text
//! ê_i = x_i / ‖x_i‖,        ∂x_i = (g_i − ê_i (ê_i · g_i)) / ‖x_i‖        (g = ∂loss/∂ê)
//! ```
//!
//! **Why.** Every loss normalises its batch (and the proxy losses their proxies) once per step.
//! candle's autograd of `x / sqrt(Σ x²)` differentiates the division (both operands), the square
//! root, the sum's broadcast and the square, and adds the two paths into `x`: about a dozen ops,
//! each a pass over the `B × D` batch (several over broadcast views, candle's slow strided path)
//! and an allocation. On the CPU that was 0.75 ms of the normalised softmax's 2.0 ms at B = 256,
//! D = 512 (2-core AMD EPYC VM, 2026-12-05), more than the `B × C` product; on a device, a dozen
//! launches where a loss at B = 256 has a budget of a few dozen. Here the norms go in detached
//! and the backward pass is one pass over the rows. The forward values are candle's bit for bit
//! (the same correctly rounded division, so every loss value is unchanged); the gradient is the
//! same function, rounded in another order.
//!
//! * CPU: the division in place of candle's broadcast, and the gradient with each row's `ê · g`
//!   summed in `f64` (`cpu::host_sums::dot`, partial sums that vectorise), rows in parallel.
//! * CUDA (`normalize/device.cu`): a kernel each, the dot in the tensor's type.
//!
//! **Tests.** The CPU op against candle's division and autograd (values bit for bit, gradients
//! to rounding) and against the formula in its own order (bit for bit); the CUDA kernels compiled
//! with the host's C++ compiler under an emulated launch grid (`tests/cuda_emulation/
//! normalize.cpp`): the division equal to candle's, the gradient equal to the formula computed in
//! the kernel's order; the GPU check's loss comparisons run the kernels in every loss.

use crate::cpu::host_sums::{dot, vectorised};
use crate::error::Result;
use crate::kernels::check_matrix;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

/// `rows / norms` (`B × D` by `B × 1`) with the gradient above, on the CPU and (kernels on) on a
/// CUDA device; `None` elsewhere — another device, dtype or shape (the caller divides with
/// candle). `norms` must be the rows' norms: the gradient assumes it.
pub(crate) fn unit_rows(rows: &Tensor, norms: &Tensor) -> Result<Option<Tensor>> {
    let floats = matches!(
        rows.dtype(),
        candle_core::DType::F32 | candle_core::DType::F64
    );
    let here = (rows.device().is_cpu() && floats) || crate::kernels::on_cuda(rows);
    if !here || rows.rank() != 2 || rows.elem_count() == 0 || norms.dtype() != rows.dtype() {
        return Ok(None);
    }
    let (x, n) = (rows.contiguous()?, norms.detach().contiguous()?);
    Ok(Some(if x.track_op() {
        x.apply_op2(&n, UnitRows)?
    } else {
        x.apply_op2_no_bwd(&n, &UnitRows)?
    }))
}

/// `x / n` row by row; its backward pass is [`UnitRowsGrad`].
struct UnitRows;

/// `(g − y (y · g)) / n` row by row, from `y = x / n`, `n` and `g`.
struct UnitRowsGrad;

/// `(rows, d)` of a contiguous matrix and its `rows × 1` norms.
fn dims(op: &str, x: &Layout, n: &Layout) -> candle_core::Result<(usize, usize)> {
    let (rows, d) = match x.dims() {
        [r, d] => (*r, *d),
        other => candle_core::bail!("{op}: a B × D matrix expected, got {other:?}"),
    };
    check_matrix(op, x, rows, d)?;
    check_matrix(op, n, rows, 1)?;
    Ok((rows, d))
}

/// Below this many values a pass stays on the calling thread: a rayon hand-off costs tens of
/// µs (`crate::cpu`), about what 64 Ki values take on one core.
const PARALLEL_VALUES: usize = 1 << 16;

/// Runs `f(r, out_r)` on every row `r` of `out` (`d > 0` values each), on rayon's threads when
/// `out` is large.
fn each_row<T: Send>(out: &mut [T], d: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() >= PARALLEL_VALUES {
        out.par_chunks_mut(d).enumerate().for_each(|(r, o)| f(r, o));
    } else {
        out.chunks_mut(d).enumerate().for_each(|(r, o)| f(r, o));
    }
}

/// `x / n` row by row (CPU): the division candle's `broadcast_div` does, value for value.
fn divide<T: WithDType + Into<f64>>(x: &[T], n: &[T], d: usize) -> Vec<T> {
    let mut y = vec![T::from_f64(0.0); x.len()];
    each_row(&mut y, d, |r, out| {
        vectorised(
            #[inline(always)]
            || {
                for (o, &v) in out.iter_mut().zip(&x[r * d..(r + 1) * d]) {
                    *o = v / n[r];
                }
            },
        )
    });
    y
}

/// `(g − y (y · g)) / n` row by row (CPU), `y · g` summed in `f64` and rounded to `T` once.
fn gradient<T: WithDType + Into<f64>>(y: &[T], n: &[T], g: &[T], d: usize) -> Vec<T> {
    let mut dx = vec![T::from_f64(0.0); y.len()];
    each_row(&mut dx, d, |r, out| {
        let (yr, gr) = (&y[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
        vectorised(
            #[inline(always)]
            || {
                let s = T::from_f64(dot(yr, gr));
                for ((o, &yv), &gv) in out.iter_mut().zip(yr).zip(gr) {
                    *o = (gv - yv * s) / n[r];
                }
            },
        )
    });
    dx
}

impl CustomOp2 for UnitRows {
    fn name(&self) -> &'static str {
        "rankwise-unit-rows"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        n: &CpuStorage,
        nl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        use crate::cpu::slice;
        let (rows, d) = dims(self.name(), xl, nl)?;
        let y = match x {
            CpuStorage::F32(_) => CpuStorage::F32(divide::<f32>(slice(x, xl)?, slice(n, nl)?, d)),
            CpuStorage::F64(_) => CpuStorage::F64(divide::<f64>(slice(x, xl)?, slice(n, nl)?, d)),
            other => candle_core::bail!("{}: f32 or f64, not {:?}", self.name(), other.dtype()),
        };
        Ok((y, Shape::from((rows, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        n: &candle_core::CudaStorage,
        nl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, d) = dims(self.name(), xl, nl)?;
        cuda::run(
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
        y: &CpuStorage,
        yl: &Layout,
        n: &CpuStorage,
        nl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        use crate::cpu::slice;
        let (rows, d) = dims(self.name(), yl, nl)?;
        check_matrix(self.name(), gl, rows, d)?;
        let dx = match y {
            CpuStorage::F32(_) => CpuStorage::F32(gradient::<f32>(
                slice(y, yl)?,
                slice(n, nl)?,
                slice(g, gl)?,
                d,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(gradient::<f64>(
                slice(y, yl)?,
                slice(n, nl)?,
                slice(g, gl)?,
                d,
            )),
            other => candle_core::bail!("{}: f32 or f64, not {:?}", self.name(), other.dtype()),
        };
        Ok((dx, Shape::from((rows, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        y: &candle_core::CudaStorage,
        yl: &Layout,
        n: &candle_core::CudaStorage,
        nl: &Layout,
        g: &candle_core::CudaStorage,
        gl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, d) = dims(self.name(), yl, nl)?;
        check_matrix(self.name(), gl, rows, d)?;
        cuda::run(
            self.name(),
            "rankwise_unit_rows_grad",
            &[(y, yl), (n, nl), (g, gl)],
            rows,
            d,
            rows,
        )
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::kernels::run_into_new;
    use candle_core::{CudaStorage, Layout, Shape};

    const SOURCE: &str = include_str!("normalize/device.cu");
    const MODULE: &str = "rankwise_normalize";

    /// `kernel(inputs…, out, rows, d)` on `threads` threads into a new `rows × d` matrix.
    pub(super) fn run(
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
        let y = plain(x.as_tensor());
        let grads = (&y * &gt).unwrap().sum_all().unwrap().backward().unwrap();
        let want = values(grads.get(&x).unwrap());
        let n = norms(x.as_tensor());
        let (yv, dx) = emulate(false, &values(x.as_tensor()), &n, &g, d);
        assert_eq!(yv, values(&y));
        for (a, b) in dx.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    /// candle's own formulation of the normalisation, the reference of the op.
    fn plain(x: &Tensor) -> Tensor {
        let n = x.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
        x.broadcast_div(&n).unwrap()
    }

    fn matrix(rows: usize, d: usize, seed: u64, dtype: DType) -> Tensor {
        Tensor::from_vec(
            crate::kernels::emulation::uniform(rows * d, seed),
            (rows, d),
            &Device::Cpu,
        )
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
    }

    /// The value and the gradient of `Σ ê ⊙ w` through `unit_rows` and through candle's
    /// formulation, for an `x` of `rows × d`.
    fn both(x: &Tensor, w: &Tensor) -> [(Vec<f64>, Vec<f64>); 2] {
        let x = Var::from_tensor(x).unwrap();
        let n = x.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
        let fast = super::unit_rows(x.as_tensor(), &n)
            .unwrap()
            .expect("the CPU takes the op");
        let slow = plain(x.as_tensor());
        [fast, slow].map(|y| {
            let g = (&y * w).unwrap().sum_all().unwrap().backward().unwrap();
            (values(&y), values(g.get(&x).unwrap()))
        })
    }

    /// On the CPU the op's values are candle's division bit for bit and its gradient candle's
    /// autograd to rounding, f32 and f64, on both sides of the parallel threshold (rows of 1, 7
    /// and 513 values; 200 × 513 takes the rayon path).
    #[test]
    fn on_the_cpu_the_op_divides_as_candle_and_differentiates_as_its_autograd() {
        for dtype in [DType::F32, DType::F64] {
            for (rows, d) in [(5, 1), (5, 7), (3, 513), (200, 513)] {
                let x = matrix(rows, d, d as u64, dtype);
                let w = matrix(rows, d, 7 + d as u64, dtype);
                let [(y, dx), (want_y, want_dx)] = both(&x, &w);
                assert_eq!(y, want_y, "{dtype:?} {rows} × {d}");
                let tol = if dtype == DType::F32 { 1e-5 } else { 1e-13 };
                // Rounding is relative to the terms `g / ‖x‖`, not to the result (for d = 1 the
                // gradient is 0 and candle's is rounding noise).
                let min_norm = values(&x)
                    .chunks(d)
                    .map(|r| r.iter().map(|v| v * v).sum::<f64>().sqrt())
                    .fold(f64::INFINITY, f64::min);
                let scale = values(&w).iter().fold(0f64, |m, v| m.max(v.abs())) / min_norm;
                for (i, (a, b)) in dx.iter().zip(&want_dx).enumerate() {
                    assert!(
                        (a - b).abs() <= tol * scale,
                        "{dtype:?} {rows} × {d}, value {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// The CPU gradient is the formula `(g − y (y·g)) / n` with `y·g` summed in `f64`
    /// (`host_sums::dot`) and rounded once, each value rounded in the tensor's type: bit for bit,
    /// so a change of that order shows here and not only as a drift in training.
    #[test]
    fn the_cpu_gradient_is_the_formula_in_its_own_order() {
        let (rows, d) = (300, 257);
        for dtype in [DType::F32, DType::F64] {
            let x = matrix(rows, d, 11, dtype);
            let g = matrix(rows, d, 12, dtype);
            let n = x.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
            let y = x.apply_op2_no_bwd(&n, &super::UnitRows).unwrap();
            let dx = values(&y.apply_op3_no_bwd(&n, &g, &super::UnitRowsGrad).unwrap());
            let (yv, nv, gv) = (values(&y), values(&n), values(&g));
            let round = |v: f64| {
                if dtype == DType::F32 {
                    f64::from(v as f32)
                } else {
                    v
                }
            };
            for r in 0..rows {
                let (yr, gr) = (&yv[r * d..(r + 1) * d], &gv[r * d..(r + 1) * d]);
                let s = round(crate::cpu::host_sums::dot(yr, gr));
                for j in 0..d {
                    let want = round(round(gr[j] - round(yr[j] * s)) / nv[r]);
                    assert_eq!(dx[r * d + j], want, "{dtype:?} row {r}, {j}");
                }
            }
        }
    }

    /// A strided view is laid out first; a tensor outside the graph gets no backward op; an
    /// integer tensor or a 3-D one is left to candle (`None`).
    #[test]
    fn views_detached_tensors_and_other_shapes() {
        let x = matrix(6, 4, 5, DType::F64);
        let t = x.t().unwrap();
        let n = t.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
        let y = super::unit_rows(&t, &n).unwrap().unwrap();
        assert_eq!(values(&y), values(&plain(&t.contiguous().unwrap())));
        assert!(!y.track_op());
        let ints = Tensor::new(&[[1u32, 2], [3, 4]], &Device::Cpu).unwrap();
        assert!(super::unit_rows(&ints, &ints.sum_keepdim(1).unwrap())
            .unwrap()
            .is_none());
        let cube = x.reshape((2, 3, 4)).unwrap();
        let cn = cube.sqr().unwrap().sum_keepdim(2).unwrap().sqrt().unwrap();
        assert!(super::unit_rows(&cube, &cn).unwrap().is_none());
    }
}

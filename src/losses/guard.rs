//! The losses' input checks, decided on the device when a read would stall it.
//!
//! Every loss checks its batch before using it: each row finite ([`crate::losses::check_batch`])
//! and, where it L2-normalises rows (embeddings, class proxies), each norm finite and non-zero
//! ([`crate::losses::l2_normalize`]). A failed check is an error naming the row, never a NaN
//! loss found steps later. Deciding it on the host means reading the values back, and on a GPU
//! a read waits for everything queued before it: in a training step, for the model's whole
//! forward pass, before the loss has launched anything — twice per step (the batch, then its
//! norms), and once more for each set of proxies. The issue of the CUDA path asks for no
//! per-step host round trip; the loss value, read once per step to be logged, is the only one
//! a step needs.
//!
//! So inside [`deferred`] (which the trainer's step and the GPU check's timings use), a check
//! of a tensor off the CPU makes its verdict where the tensor is: a scalar that is 0 when every
//! row passes and NaN otherwise,
//!
//! ```text
//! finite rows:    Σᵢ (xᵢ − xᵢ)                   over every value (NaN − NaN, ∞ − ∞ are NaN)
//! valid norms:    Σᵢ (nᵢ − nᵢ) + (1/nᵢ − 1/nᵢ)    over the norms (1/0 = ∞)
//! ```
//!
//! (one kernel, `guard/device.cu`, on a CUDA device; those tensor operations elsewhere), and
//! `deferred` adds every verdict to the loss value. A good batch's value is then the unchecked
//! value (`v + 0 = v`) with the same gradient (a verdict is a constant); a bad batch's value is
//! NaN, whatever the loss does with a NaN on its way (a ReLU or a mining rule could drop it).
//! The caller reads the value, as the trainer does to log it, and on a value that is not finite
//! calls [`explain`], which runs the loss once more with the checks made at once on the host,
//! so that the error names the row as it would have.
//!
//! Outside `deferred`, and on the CPU (where reading costs nothing), the checks are made at
//! once, as every direct call of a loss expects. A norm whose reciprocal overflows (below
//! `3e-39` in `f32`) counts as zero for a deferred check, as a zero would: `1/n` is what the
//! normalisation divides by.

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::RankLoss;
use candle_core::{DType, Tensor, TensorId};
use std::cell::RefCell;

thread_local! {
    /// The checks of the innermost [`deferred`] call on this thread (`None`: none open, the
    /// checks are made at once).
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
    /// Tests: the CPU counts as a device, so the deferred path runs without one.
    #[cfg(test)]
    static CPU_DEFERS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The deferred checks of one [`deferred`] call.
#[derive(Default)]
struct Pending {
    /// The checks made, by the tensor checked: a tensor checked twice (HAPPIER's two terms
    /// each check the batch and normalise it) gets one verdict.
    done: Vec<(TensorId, Check)>,
    /// The verdicts, each a scalar 0 or NaN, added to the value at the end.
    verdicts: Vec<Tensor>,
    /// The `f32` flag of a CUDA device, one of `verdicts`, into which every kernel on that
    /// device writes: one zeroed scalar and one sum per call, whatever the number of checks.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    flag: Option<Tensor>,
}

/// `f()` (a loss's forward pass) with the input checks of the tensors off the CPU decided on
/// their device: the value is NaN when one failed (see the module documentation), otherwise
/// exactly `f()`'s. Nested calls keep their own verdicts.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::hierarchy::Labels;
/// use rankwise::losses::{contrastive::Contrastive, guard, RankLoss};
///
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// let loss = Contrastive::default();
/// let direct = loss.forward(&x, &labels)?.to_scalar::<f64>()?;
/// let checked = guard::deferred(|| loss.forward(&x, &labels))?.to_scalar::<f64>()?;
/// assert_eq!(direct.to_bits(), checked.to_bits());
/// // A bad batch: the error names the row (the checks of a CPU batch are made at once).
/// let bad = Tensor::new(&[[1.0f64, 0.0], [0.0, 0.0], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let e = guard::deferred(|| loss.forward(&bad, &labels)).unwrap_err().to_string();
/// assert!(e.contains("row 1"), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn deferred(f: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    /// Puts the enclosing call's checks back, also when `f` fails or panics.
    struct Restore(Option<Pending>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            PENDING.with(|p| *p.borrow_mut() = outer);
        }
    }
    let outer = PENDING.with(|p| p.borrow_mut().replace(Pending::default()));
    let restore = Restore(outer);
    let value = f();
    let pending = PENDING.with(|p| p.borrow_mut().take()).unwrap_or_default();
    drop(restore);
    let mut value = value?;
    for verdict in pending.verdicts {
        let verdict = if verdict.dtype() == value.dtype() {
            verdict
        } else {
            verdict.to_dtype(value.dtype())?
        };
        value = value.broadcast_add(&verdict)?;
    }
    Ok(value)
}

/// After a deferred forward pass gave a value that is not finite: the same loss on the same
/// batch once more, with its checks made at once, so that a bad row is an error naming it.
/// `Ok` when every check passes (the value was not finite for another reason). A loss with
/// state (RaMBO's score memory) takes this batch in once more; the caller is stopping anyway.
pub fn explain(loss: &dyn RankLoss, embeddings: &Tensor, labels: &Labels) -> Result<()> {
    if !off_cpu(embeddings) {
        // On the CPU the checks were made at once: nothing was deferred.
        return Ok(());
    }
    let outer = PENDING.with(|p| p.borrow_mut().take());
    let result = loss.forward(&embeddings.detach(), labels).map(drop);
    PENDING.with(|p| *p.borrow_mut() = outer);
    result
}

/// Whether `x` is off the CPU (in tests, also the CPU standing for a device).
fn off_cpu(x: &Tensor) -> bool {
    #[cfg(test)]
    if CPU_DEFERS.with(|c| c.get()) {
        return true;
    }
    !x.device().is_cpu()
}

/// Whether a check of `x` is deferred: inside [`deferred`], and `x` off the CPU.
fn defers(x: &Tensor) -> bool {
    off_cpu(x) && PENDING.with(|p| p.borrow().is_some())
}

/// Which condition a verdict checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Every value finite.
    Finite,
    /// Every value (a row's norm) finite with a finite reciprocal.
    Norm,
}

/// Adds the verdict of `check` over the values of `x` to the innermost [`deferred`] call's,
/// unless `source` (the tensor the check is about) already has one.
fn defer(x: &Tensor, source: &Tensor, check: Check) -> Result<()> {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let Some(pending) = p.as_mut() else {
            return Ok(());
        };
        let key = (source.id(), check);
        if pending.done.contains(&key) {
            return Ok(());
        }
        pending.done.push(key);
        #[cfg(feature = "cuda")]
        if crate::kernels::on_cuda(x) {
            if x.elem_count() == 0 {
                return Ok(());
            }
            let flag = match &pending.flag {
                Some(flag) if flag.device().same_device(x.device()) => flag.clone(),
                _ => {
                    let flag = Tensor::zeros((), DType::F32, x.device())?;
                    pending.verdicts.push(flag.clone());
                    pending.flag = Some(flag.clone());
                    flag
                }
            };
            flag.inplace_op2(&x.detach().contiguous()?, &cuda::Mark(check))?;
            return Ok(());
        }
        pending.verdicts.push(verdict_by_tensor_ops(x, check)?);
        Ok(())
    })
}

/// The verdict of `check` over the values of `x` as candle operations (a device without the
/// kernels): a scalar of `x`'s dtype, 0 or NaN.
fn verdict_by_tensor_ops(x: &Tensor, check: Check) -> Result<Tensor> {
    let x = x.detach();
    // `v − v`: 0 for a finite value, NaN for NaN and the infinities.
    let own = x.sub(&x)?;
    let terms = match check {
        Check::Finite => own,
        Check::Norm => {
            let r = x.recip()?;
            (own + r.sub(&r)?)?
        }
    };
    Ok(terms.sum_all()?)
}

/// Checks that `x` is a finite `N × D` float matrix (`what` names it in errors); returns
/// `(N, D)`. The finiteness is deferred inside [`deferred`] off the CPU; the shape never is.
pub(crate) fn finite_rows(x: &Tensor, what: &str) -> Result<(usize, usize)> {
    if !defers(x) {
        return crate::retrieval::check_embeddings(x, what);
    }
    let dims = crate::retrieval::check_matrix_shape(x, what)?;
    defer(x, x, Check::Finite)?;
    Ok(dims)
}

/// Checks that every norm in `norms` (`B × 1`, those of `rows` as `l2_normalize` computes them)
/// is finite and non-zero, naming `field` and the row; deferred inside [`deferred`] off the CPU.
pub(crate) fn valid_norms(rows: &Tensor, norms: &Tensor, field: &str) -> Result<()> {
    if defers(norms) {
        return defer(norms, rows, Check::Norm);
    }
    let values = norms
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    norms_error(&values, field).map_or(Ok(()), Err)
}

/// The error of the first row norm in `norms` that cannot divide, naming `field` and the row:
/// one not finite comes from a value that is not (the message of [`finite_rows`]), one of zero
/// from a row of zeros.
pub(crate) fn norms_error(norms: &[f64], field: &str) -> Option<Error> {
    let row = norms.iter().position(|&n| n <= 0.0 || !n.is_finite())?;
    Some(Error::invalid(
        field,
        if norms[row].is_finite() {
            format!("row {row} has zero norm and cannot be L2-normalised")
        } else {
            format!("row {row} contains NaN or infinity")
        },
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::Check;
    use crate::kernels::{check_elementwise, dtype_error, instance, per_row, ptx, view, Float};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp2, Layout};

    const SOURCE: &str = include_str!("guard/device.cu");
    const MODULE: &str = "rankwise_guard";

    /// Writes NaN into an `f32` flag (the tensor operated on in place) when a value of the
    /// other tensor fails `Check`.
    pub(super) struct Mark(pub Check);

    impl Mark {
        fn launch<T: Float>(
            &self,
            flag: &mut CudaStorage,
            flag_l: &Layout,
            x: &CudaStorage,
            x_l: &Layout,
        ) -> candle_core::Result<()> {
            let dev = flag.device().clone();
            let kernel = match self.0 {
                Check::Finite => "rankwise_guard_finite",
                Check::Norm => "rankwise_guard_norm",
            };
            let f =
                dev.get_or_load_custom_func(&instance::<T>(kernel), MODULE, ptx(MODULE, SOURCE)?)?;
            let n = x_l.shape().elem_count();
            let x = view::<T>(x, x_l)?;
            let mut out = flag
                .as_cuda_slice_mut::<f32>()?
                .slice_mut(flag_l.start_offset()..);
            let (count, nan) = (n as u64, f32::NAN);
            let mut l = f.builder();
            l.arg(&x).arg(&count).arg(&nan).arg(&mut out);
            // SAFETY: `x` holds `n` contiguous values (checked by `cuda_fwd`) and the flag
            // one; the kernel reads indices below `n` and writes the flag's only value.
            unsafe { l.launch(per_row(n)) }.w()?;
            Ok(())
        }
    }

    impl InplaceOp2 for Mark {
        fn name(&self) -> &'static str {
            "rankwise-guard"
        }

        fn cpu_fwd(
            &self,
            _: &mut CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> candle_core::Result<()> {
            Err(candle_core::Error::Msg(
                "rankwise-guard runs on a CUDA device; the CPU checks at once".into(),
            ))
        }

        fn cuda_fwd(
            &self,
            flag: &mut CudaStorage,
            flag_l: &Layout,
            x: &CudaStorage,
            x_l: &Layout,
        ) -> candle_core::Result<()> {
            if flag.dtype() != DType::F32 || flag_l.shape().elem_count() != 1 {
                return Err(candle_core::Error::Msg(format!(
                    "{}: the flag must be one f32 value, got {:?} {:?}",
                    self.name(),
                    flag.dtype(),
                    flag_l.dims()
                )));
            }
            let n = x_l.shape().elem_count();
            match check_elementwise(self.name(), n, &[(x, x_l)])? {
                DType::F32 => self.launch::<f32>(flag, flag_l, x, x_l),
                DType::F64 => self.launch::<f64>(flag, flag_l, x, x_l),
                d => Err(dtype_error(self.name(), d)),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::Device;

    /// Runs `f` with the CPU counting as a device: the deferred path without a GPU.
    pub(crate) fn with_cpu_deferring<R>(f: impl FnOnce() -> R) -> R {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                CPU_DEFERS.with(|c| c.set(false));
            }
        }
        CPU_DEFERS.with(|c| c.set(true));
        let _reset = Reset;
        f()
    }

    /// Equal, NaN equal to NaN.
    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || a == b
    }

    /// The predicate both verdicts implement, on one value.
    fn fails(v: f64, check: Check, f32_values: bool) -> bool {
        let finite = |x: f64| x.is_finite();
        match check {
            Check::Finite => !finite(v),
            Check::Norm => {
                let r = if f32_values {
                    f64::from(1.0f32 / v as f32)
                } else {
                    1.0 / v
                };
                !finite(v) || !finite(r)
            }
        }
    }

    /// Values each check must see through: zeros of both signs, infinities, NaN, a subnormal.
    fn cases(f32_values: bool) -> Vec<Vec<f64>> {
        let tiny = if f32_values { 1e-40 } else { 1e-310 };
        let mut cases = vec![vec![], vec![0.5, 2.0, 1e30]];
        for bad in [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, tiny] {
            for at in [0usize, 5, 16] {
                let mut v = crate::kernels::emulation::uniform(17, at as u64 + 3);
                v.iter_mut().for_each(|x| *x = x.abs() + 0.25);
                v[at] = bad;
                cases.push(v);
            }
        }
        cases
    }

    fn tensor(v: &[f64], f32_values: bool) -> Tensor {
        let t = Tensor::new(v, &Device::Cpu).unwrap();
        if f32_values {
            t.to_dtype(DType::F32).unwrap()
        } else {
            t
        }
    }

    #[test]
    fn the_tensor_verdicts_are_zero_or_nan_as_the_predicate_says() {
        for f32_values in [false, true] {
            for v in cases(f32_values) {
                for check in [Check::Finite, Check::Norm] {
                    let want = v.iter().any(|&x| fails(x, check, f32_values));
                    let got = verdict_by_tensor_ops(&tensor(&v, f32_values), check)
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_scalar::<f64>()
                        .unwrap();
                    if want {
                        assert!(!got.is_finite(), "{check:?} {v:?}: {got}");
                    } else {
                        assert_eq!(got.to_bits(), 0f64.to_bits(), "{check:?} {v:?}");
                    }
                }
            }
        }
    }

    /// The kernels run on the host by the harness: the two verdicts of `v`.
    fn emulate(f32_values: bool, v: &[f64]) -> (f64, f64) {
        let mut input = Vec::new();
        input.extend(u32::from(f32_values).to_le_bytes());
        input.extend((v.len() as u64).to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, v, f32_values);
        let out = crate::kernels::emulation::run("guard", &input);
        assert_eq!(out.len(), 2);
        (out[0], out[1])
    }

    #[test]
    fn the_kernels_follow_the_predicate() {
        for f32_values in [false, true] {
            for v in cases(f32_values) {
                let (finite, norm) = emulate(f32_values, &v);
                for (got, check) in [(finite, Check::Finite), (norm, Check::Norm)] {
                    let want = v.iter().any(|&x| fails(x, check, f32_values));
                    let expected = if want { f64::NAN } else { 0.0 };
                    assert!(same(got, expected), "{check:?} {v:?}: {got}");
                }
            }
        }
    }

    #[test]
    fn outside_a_deferred_call_and_on_the_cpu_the_checks_are_made_at_once() {
        let bad = Tensor::new(&[[1.0f32, 0.0], [f32::NAN, 1.0]], &Device::Cpu).unwrap();
        let e = deferred(|| {
            finite_rows(&bad, "embeddings")?;
            Ok(Tensor::new(0f32, &Device::Cpu)?)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("row 1") && e.contains("embeddings"), "{e}");
        // Off a deferred call, the CPU-as-device still checks at once.
        let e = with_cpu_deferring(|| finite_rows(&bad, "embeddings").unwrap_err().to_string());
        assert!(e.contains("row 1"), "{e}");
    }

    #[test]
    fn deferred_verdicts_make_the_value_nan_and_leave_a_good_value_alone() {
        let good = Tensor::new(&[[1.0f32, 0.0], [0.5, 1.0]], &Device::Cpu).unwrap();
        let zero = Tensor::new(&[[1.0f32, 0.0], [0.0, 0.0]], &Device::Cpu).unwrap();
        let value = |x: &Tensor| {
            with_cpu_deferring(|| {
                deferred(|| {
                    finite_rows(x, "embeddings")?;
                    let norms = x.sqr()?.sum_keepdim(1)?.sqrt()?;
                    valid_norms(x, &norms, "embeddings")?;
                    Ok(Tensor::new(-0.25f64, &Device::Cpu)?)
                })
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
            })
        };
        assert_eq!(value(&good), -0.25);
        assert!(value(&zero).is_nan());
        // The shape is still checked at once.
        let flat = Tensor::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        let e = with_cpu_deferring(|| {
            deferred(|| {
                finite_rows(&flat, "embeddings")?;
                Ok(flat.clone())
            })
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("N × D"), "{e}");
    }

    /// A tensor checked twice (as HAPPIER's two terms each check the batch and normalise it)
    /// gets one verdict per check.
    #[test]
    fn a_tensor_checked_twice_gets_one_verdict() {
        let x = Tensor::new(&[[1.0f32, 0.0], [0.5, 1.0]], &Device::Cpu).unwrap();
        let counted = with_cpu_deferring(|| {
            deferred(|| {
                for _ in 0..2 {
                    finite_rows(&x, "embeddings")?;
                    crate::losses::l2_normalize(&x, "embeddings")?;
                }
                let n = PENDING.with(|p| p.borrow().as_ref().map(|p| p.verdicts.len()));
                Ok(Tensor::new(n.unwrap_or(0) as f32, &Device::Cpu)?)
            })
        });
        assert_eq!(counted.unwrap().to_scalar::<f32>().unwrap(), 2.0);
    }

    #[test]
    fn nested_and_failing_calls_keep_their_own_verdicts() {
        let bad = Tensor::new(&[[f32::INFINITY, 0.0]], &Device::Cpu).unwrap();
        let good = Tensor::new(&[[1.0f32, 0.0]], &Device::Cpu).unwrap();
        with_cpu_deferring(|| {
            let outer = deferred(|| {
                finite_rows(&good, "embeddings")?;
                // The inner call's bad verdict stays in the inner value.
                let inner = deferred(|| {
                    finite_rows(&bad, "embeddings")?;
                    Ok(Tensor::new(1f32, &Device::Cpu)?)
                })?;
                assert!(inner.to_scalar::<f32>()?.is_nan());
                // A failing call leaves nothing behind either.
                let failed = deferred(|| -> Result<Tensor> {
                    finite_rows(&bad, "embeddings")?;
                    Err(Error::invalid("x", "fails"))
                });
                assert!(failed.is_err());
                Ok(Tensor::new(2f32, &Device::Cpu)?)
            })
            .unwrap();
            assert_eq!(outer.to_scalar::<f32>().unwrap(), 2.0);
        });
        // No call is left open.
        assert!(PENDING.with(|p| p.borrow().is_none()));
    }
}

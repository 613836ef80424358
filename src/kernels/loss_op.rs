//! One candle op for a loss computed by CUDA kernels: its forward pass reduces a matrix to the
//! scalar loss and leaves what the gradient needs on the device; its backward pass is one more
//! launch, reading the incoming gradient there. The contrastive loss, the proxy losses' softmax
//! cross-entropy, the triplet minings, FastAP, RaMBO and the smooth-rank losses' `1 − mean AP`
//! share it: each says what it launches
//! ([`KernelLoss`]), this module how candle calls it (the shape and dtype checks, the dispatch
//! on `f32`/`f64`, the state kept between the two passes).

use super::{check_matrix, dtype_error, not_on_cpu, view, Float};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};
use std::sync::{Arc, Mutex};

/// A loss whose forward and backward passes are CUDA kernels on a `rows × cols` input `x`.
pub(crate) trait KernelLoss: Send + Sync + 'static {
    /// What the forward pass leaves on the device for the backward pass.
    type Saved: Clone + Send + Sync + 'static;
    /// The op's name, in errors.
    const NAME: &'static str;
    /// Its backward pass's name, in errors.
    const GRAD_NAME: &'static str;

    /// The input's shape `(rows, cols)` that the loss expects, given the layout it got (which
    /// the op then checks against it).
    fn dims(&self, layout: &Layout) -> (usize, usize);

    /// Queues the forward pass on `x` (contiguous, `dims`): the loss (one value) and the state
    /// for the backward pass.
    fn forward<T: Float>(
        &self,
        dev: &CudaDevice,
        x: &CudaView<T>,
        dims: (usize, usize),
    ) -> candle_core::Result<(CudaSlice<T>, Self::Saved)>;

    /// Queues the backward pass: `∂L/∂x` (`dims`) for the incoming gradient `g` (one value).
    fn backward<T: Float>(
        &self,
        dev: &CudaDevice,
        x: &CudaView<T>,
        g: &CudaView<T>,
        saved: &Self::Saved,
        dims: (usize, usize),
    ) -> candle_core::Result<CudaSlice<T>>;
}

/// `loss` of `x` (a matrix on a CUDA device), differentiable in `x`.
pub(crate) fn apply<L: KernelLoss>(x: &Tensor, loss: L) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1(LossOp {
        loss: Arc::new(loss),
        saved: Mutex::new(None),
    })
}

/// `x → L`; its backward pass is [`GradOp`].
struct LossOp<L: KernelLoss> {
    loss: Arc<L>,
    saved: Mutex<Option<L::Saved>>,
}

/// `(x, g) → ∂L/∂x`, from the forward pass's state.
struct GradOp<L: KernelLoss> {
    loss: Arc<L>,
    saved: L::Saved,
}

fn poisoned(name: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{name}: the lock on its saved state is poisoned"))
}

/// The checked shape of `x`.
fn checked_dims<L: KernelLoss>(
    loss: &L,
    name: &str,
    l: &Layout,
) -> candle_core::Result<(usize, usize)> {
    let dims = loss.dims(l);
    check_matrix(name, l, dims.0, dims.1)?;
    Ok(dims)
}

impl<L: KernelLoss> CustomOp1 for LossOp<L> {
    fn name(&self) -> &'static str {
        L::NAME
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(not_on_cpu(L::NAME))
    }

    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = checked_dims(self.loss.as_ref(), L::NAME, l)?;
        let dev = x.device().clone();
        let (loss, saved) = match x.dtype() {
            DType::F32 => {
                let (v, s) = self.loss.forward(&dev, &view::<f32>(x, l)?, dims)?;
                (CudaStorage::wrap_cuda_slice(v, dev), s)
            }
            DType::F64 => {
                let (v, s) = self.loss.forward(&dev, &view::<f64>(x, l)?, dims)?;
                (CudaStorage::wrap_cuda_slice(v, dev), s)
            }
            d => return Err(dtype_error(L::NAME, d)),
        };
        *self.saved.lock().map_err(|_| poisoned(L::NAME))? = Some(saved);
        Ok((loss, Shape::from(())))
    }

    fn bwd(&self, x: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let saved = self
            .saved
            .lock()
            .map_err(|_| poisoned(L::NAME))?
            .clone()
            .ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "{}: the backward pass before the forward pass",
                    L::NAME
                ))
            })?;
        let op = GradOp {
            loss: Arc::clone(&self.loss),
            saved,
        };
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

impl<L: KernelLoss> CustomOp2 for GradOp<L> {
    fn name(&self) -> &'static str {
        L::GRAD_NAME
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(not_on_cpu(L::GRAD_NAME))
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = checked_dims(self.loss.as_ref(), L::GRAD_NAME, xl)?;
        if gl.shape().elem_count() != 1 || !gl.is_contiguous() || g.dtype() != x.dtype() {
            return Err(candle_core::Error::Msg(format!(
                "{}: the incoming gradient must be one {:?} value, got {:?} {:?}",
                L::GRAD_NAME,
                x.dtype(),
                g.dtype(),
                gl.dims()
            )));
        }
        let dev = x.device().clone();
        let dx = match x.dtype() {
            DType::F32 => CudaStorage::wrap_cuda_slice(
                self.loss.backward(
                    &dev,
                    &view::<f32>(x, xl)?,
                    &view::<f32>(g, gl)?,
                    &self.saved,
                    dims,
                )?,
                dev,
            ),
            DType::F64 => CudaStorage::wrap_cuda_slice(
                self.loss.backward(
                    &dev,
                    &view::<f64>(x, xl)?,
                    &view::<f64>(g, gl)?,
                    &self.saved,
                    dims,
                )?,
                dev,
            ),
            d => return Err(dtype_error(L::GRAD_NAME, d)),
        };
        Ok((dx, Shape::from(dims)))
    }
}

//! Attaching a value computed outside candle's autograd graph to that graph, with a hand-written
//! backward pass.
//!
//! Several computations are cheaper, or keep far less memory, when their forward pass runs
//! outside the graph and their gradient is written out in closed form: the row-loss engine
//! (losses::pairwise_rows), the smooth-rank APs and the device kernels' losses (their Jacobian
//! times the incoming gradient: one launch, where `value + Σ x ⊙ J − detach(…)` took eight), the
//! device convolution (models::conv) and BatchNorm's normalisation (models::layers). Each then
//! needs the same thing: an op whose forward pass returns the precomputed value — a copy, so
//! that it runs on every device — and whose backward pass calls the closed form. [`attach`] and
//! [`attach2`] are that op, for one and for two differentiable inputs.

use crate::error::Result;
use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp2, CustomOp3, Layout, MetalStorage, Shape, Tensor,
};

/// The gradient with respect to one input, from `(input, output, ∂output)`.
type Backward1 =
    dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Option<Tensor>> + Send + Sync;

/// The gradients with respect to two inputs, from `(a, b, ∂output)`.
type Backward2 = dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)>
    + Send
    + Sync;

/// `value` as a function of `input` in the graph: the forward pass copies `value` (computed
/// beforehand, detached, on `input`'s device); the backward pass is
/// `backward(input, output, ∂output)`, which returns `∂input` (`None`: no gradient).
pub(crate) fn attach(
    input: &Tensor,
    value: &Tensor,
    backward: impl Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Option<Tensor>>
        + Send
        + Sync
        + 'static,
) -> Result<Tensor> {
    Ok(input.apply_op2(
        value,
        Attached {
            backward: Box::new(backward),
        },
    )?)
}

/// [`attach`] for a value that depends on two inputs: `backward(a, b, ∂output)` returns
/// `(∂a, ∂b)`.
pub(crate) fn attach2(
    a: &Tensor,
    b: &Tensor,
    value: &Tensor,
    backward: impl Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)>
        + Send
        + Sync
        + 'static,
) -> Result<Tensor> {
    Ok(a.apply_op3(
        b,
        value,
        Attached2 {
            backward: Box::new(backward),
        },
    )?)
}

/// A copy of the precomputed value, on whichever device holds it.
fn copy<S: BackendStorage>(value: &S, layout: &Layout) -> candle_core::Result<(S, Shape)> {
    Ok((value.try_clone(layout)?, layout.shape().clone()))
}

struct Attached {
    backward: Box<Backward1>,
}

impl CustomOp2 for Attached {
    fn name(&self) -> &'static str {
        "rankwise-attached"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        value: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        copy(value, layout)
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        value: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        copy(value, layout)
    }

    fn metal_fwd(
        &self,
        _: &MetalStorage,
        _: &Layout,
        value: &MetalStorage,
        layout: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        copy(value, layout)
    }

    fn bwd(
        &self,
        input: &Tensor,
        _value: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        Ok(((self.backward)(input, res, grad)?, None))
    }
}

struct Attached2 {
    backward: Box<Backward2>,
}

impl CustomOp3 for Attached2 {
    fn name(&self) -> &'static str {
        "rankwise-attached2"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        value: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        copy(value, layout)
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
        value: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        copy(value, layout)
    }

    fn metal_fwd(
        &self,
        _: &MetalStorage,
        _: &Layout,
        _: &MetalStorage,
        _: &Layout,
        value: &MetalStorage,
        layout: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        copy(value, layout)
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _value: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (ga, gb) = (self.backward)(a, b, grad)?;
        Ok((ga, gb, None))
    }
}

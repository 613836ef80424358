//! The training step's convolutions, batch normalisation and max pooling through cuDNN on CUDA
//! (feature `cudnn`): each one cuDNN call reading and writing the tensors' device memory in
//! place.
//!
//! Why: built on candle's CUDA ops, ResNet-50 at 224 × 224, batch 256, trained at 0.064× the
//! images/s of PyTorch eager on an H200 and peaked at ~124 GB of device memory against
//! PyTorch's 21.5 GB (benches/gpu/). candle's convolution is im2col + one GEMM, which writes a
//! `C·K² × H'·W'` patch matrix per image; its backward is ours, made of more such convolutions
//! (`super::conv::conv2d_device`); and every op that attaches a precomputed value to the graph
//! (`crate::attach`) keeps that value *and* a copy of it. Here the forward convolution, its two
//! backward passes (data and filter) and batch normalisation's training forward and backward
//! are the cuDNN kernels PyTorch calls, and each op's result is the buffer cuDNN wrote: the graph
//! keeps the same activations PyTorch keeps (each op's input; BatchNorm's batch statistics).
//!
//! **Determinism.** cuDNN's heuristics may rank first a backward algorithm that accumulates with
//! atomics, whose bits change from run to run. The first *deterministic* algorithm of the
//! heuristic ranking is taken instead (for each shape once per thread), so that a run and its
//! resume from a checkpoint stay bit-identical on one GPU (the resume check of
//! `examples/gpu_check.rs`), as on the CPU.
//!
//! **Precision.** The descriptors keep each algorithm's math type from cuDNN's ranking; with
//! cuDNN's default math, `f32` convolutions may run on TF32 tensor cores (Ampere and later), as
//! PyTorch's do by default (`torch.backends.cudnn.allow_tf32`). `NVIDIA_TF32_OVERRIDE=0` in the
//! environment keeps them in full `f32` (the GPU check's comparisons with the CPU run so); `f64`
//! is never reduced.
//!
//! **Switch.** [`enabled`] is on unless the environment sets `RANKWISE_CUDNN=0` (or
//! [`set_enabled`] turns it off): the same binary then trains through candle's ops, for a
//! side-by-side measurement or as a fallback.

use crate::error::Result;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cudnn::{result, sys};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId};
use candle_core::op::BackpropOp;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Storage, Tensor,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::kernels::view;

static SWITCH: crate::switch::EnvSwitch = crate::switch::EnvSwitch::new("RANKWISE_CUDNN");

/// Whether the models route their convolutions, training-mode batch normalisation and max
/// pooling on CUDA through cuDNN: on, unless `RANKWISE_CUDNN` is `0`, `off` or `false` or
/// [`set_enabled`] said otherwise.
pub fn enabled() -> bool {
    SWITCH.on()
}

/// Turns the cuDNN path on or off for the whole process (the GPU check measures both).
pub fn set_enabled(on: bool) {
    SWITCH.set(on);
}

/// Whether `x` takes the cuDNN path: [`enabled`], on a CUDA device, in `f32` or `f64`.
pub fn applies(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::F64) && enabled()
}

/// `x` (`B × C_in × H × W`) convolved with `kernel` (`C_out × C_in × K × K`), symmetric zero
/// `padding`, `stride` (PyTorch's `F.conv2d` without bias), forward and backward by cuDNN.
/// Both inputs must be on one CUDA device, in one of `f32`/`f64`.
pub fn conv2d(x: &Tensor, kernel: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let (x, kernel) = (x.contiguous()?, kernel.contiguous()?);
    let op = ConvPass {
        pass: Pass::Forward,
        stride,
        padding,
        out: [0; 4],
    };
    if !(x.track_op() || kernel.track_op()) {
        return Ok(x.apply_op2_no_bwd(&kernel, &op)?);
    }
    Ok(x.apply_op2(&kernel, op)?)
}

/// Batch normalisation in training mode by cuDNN (`CUDNN_BATCHNORM_SPATIAL`): the output
/// `γ·(x − μ)/√(σ² + ε) + β` with the batch mean `μ` and biased variance `σ²` of each channel,
/// and, for the running averages, `μ` and cuDNN's saved `1/√(σ² + ε)` (detached, `C` values
/// each; the variance is `1/s² − ε`, which the running-average kernel derives itself). `eps`
/// must be at least cuDNN's minimum, 1e-5 (PyTorch's default).
pub fn batch_norm_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (x, weight, bias) = (x.contiguous()?, weight.contiguous()?, bias.contiguous()?);
    let saved: Saved = Arc::new(Mutex::new(None));
    let op = BatchNormTrain {
        eps,
        saved: saved.clone(),
    };
    let y = if x.track_op() || weight.track_op() || bias.track_op() {
        x.apply_op3(&weight, &bias, op)?
    } else {
        x.apply_op3_no_bwd(&weight, &bias, &op)?
    };
    let c = x.dim(1)?;
    let (mean, inv_std) = {
        let guard = saved
            .lock()
            .map_err(|_| candle_core::Error::Msg("batch-norm statistics lock poisoned".into()))?;
        let (mean, inv_std) = guard.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("the cuDNN batch-norm forward saved no statistics".into())
        })?;
        let layout = Layout::contiguous(c);
        let copy = |s: &CudaStorage| -> Result<Tensor> {
            Ok(Tensor::from_storage(
                Storage::Cuda(s.try_clone(&layout)?),
                c,
                BackpropOp::none(),
                false,
            ))
        };
        (copy(mean)?, copy(inv_std)?)
    };
    Ok((y, mean, inv_std))
}

/// The batch mean and `1/√(σ² + ε)` that the forward pass saved, for its backward pass.
type Saved = Arc<Mutex<Option<(CudaStorage, CudaStorage)>>>;

fn not_on_cpu(name: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{name} is a cuDNN op: it runs on CUDA devices only"
    ))
}

/// The two floating-point types cuDNN's convolutions and batch normalisation take here.
trait Float: CudaDType + DeviceRepr + Copy + 'static {
    const CUDNN: sys::cudnnDataType_t;
    const IS_F64: bool;
    const ONE: Self;
    const ZERO: Self;
}

impl Float for f32 {
    const CUDNN: sys::cudnnDataType_t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    const IS_F64: bool = false;
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
}

impl Float for f64 {
    const CUDNN: sys::cudnnDataType_t = sys::cudnnDataType_t::CUDNN_DATA_DOUBLE;
    const IS_F64: bool = true;
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
}

/// A cuDNN handle bound to the stream of one candle device, so that its kernels are ordered
/// with candle's. cuDNN handles are neither `Send` nor `Sync`: one per thread and device.
struct Handle(sys::cudnnHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `create_handle`, destroyed once.
        unsafe {
            let _ = result::destroy_handle(self.0);
        }
    }
}

/// An algorithm of one of the three passes.
#[derive(Clone, Copy)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// The algorithm (and its math type) chosen for one convolution pass and shape.
#[derive(Clone, Copy)]
struct Choice {
    algo: Algo,
    math: sys::cudnnMathType_t,
}

thread_local! {
    static HANDLES: RefCell<HashMap<DeviceId, Rc<Handle>>> = RefCell::new(HashMap::new());
    static CHOICES: RefCell<HashMap<ConvKey, Vec<Choice>>> = RefCell::new(HashMap::new());
}

fn handle(dev: &CudaDevice) -> candle_core::Result<Rc<Handle>> {
    HANDLES.with(|handles| {
        if let Some(h) = handles.borrow().get(&dev.id()) {
            return Ok(h.clone());
        }
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread()?;
        let h = Handle(result::create_handle()?);
        // SAFETY: a live handle and the device's live stream.
        unsafe { result::set_stream(h.0, stream.cu_stream() as *mut _)? };
        let h = Rc::new(h);
        handles.borrow_mut().insert(dev.id(), h.clone());
        Ok(h)
    })
}

struct TensorDesc(sys::cudnnTensorDescriptor_t);

impl TensorDesc {
    /// A packed NCHW tensor of `dims`.
    fn new(dtype: sys::cudnnDataType_t, dims: [usize; 4]) -> candle_core::Result<Self> {
        let d = TensorDesc(result::create_tensor_descriptor()?);
        // SAFETY: a live descriptor.
        unsafe {
            result::set_tensor4d_descriptor(
                d.0,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                dtype,
                dims.map(|v| v as i32),
            )?
        };
        Ok(d)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = result::destroy_tensor_descriptor(self.0);
        }
    }
}

struct FilterDesc(sys::cudnnFilterDescriptor_t);

impl FilterDesc {
    fn new(dtype: sys::cudnnDataType_t, dims: [usize; 4]) -> candle_core::Result<Self> {
        let d = FilterDesc(result::create_filter_descriptor()?);
        // SAFETY: a live descriptor.
        unsafe {
            result::set_filter4d_descriptor(
                d.0,
                dtype,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                dims.map(|v| v as i32),
            )?
        };
        Ok(d)
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = result::destroy_filter_descriptor(self.0);
        }
    }
}

struct ConvDesc(sys::cudnnConvolutionDescriptor_t);

impl ConvDesc {
    fn new(
        dtype: sys::cudnnDataType_t,
        stride: usize,
        padding: usize,
    ) -> candle_core::Result<Self> {
        let d = ConvDesc(result::create_convolution_descriptor()?);
        let (s, p) = (stride as i32, padding as i32);
        // SAFETY: a live descriptor.
        unsafe {
            result::set_convolution2d_descriptor(
                d.0,
                p,
                p,
                s,
                s,
                1,
                1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                dtype,
            )?
        };
        Ok(d)
    }

    fn set_math(&self, math: sys::cudnnMathType_t) -> candle_core::Result<()> {
        // SAFETY: a live descriptor.
        unsafe { result::set_convolution_math_type(self.0, math)? };
        Ok(())
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = result::destroy_convolution_descriptor(self.0);
        }
    }
}

/// Which pass of a convolution, for the cache of algorithm choices.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Pass {
    Forward,
    BackwardData,
    BackwardFilter,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct ConvKey {
    pass: Pass,
    device: DeviceId,
    f64: bool,
    x: [usize; 4],
    w: [usize; 4],
    stride: usize,
    padding: usize,
}

/// The descriptors of one convolution `y = x ⋆ w`, for any of its three passes.
struct ConvDescs {
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
}

impl ConvDescs {
    fn new<T: Float>(g: &Geometry) -> candle_core::Result<Self> {
        Ok(ConvDescs {
            x: TensorDesc::new(T::CUDNN, g.x)?,
            w: FilterDesc::new(T::CUDNN, g.w)?,
            y: TensorDesc::new(T::CUDNN, g.y())?,
            conv: ConvDesc::new(T::CUDNN, g.stride, g.padding)?,
        })
    }
}

/// Shapes of one convolution.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    x: [usize; 4],
    w: [usize; 4],
    stride: usize,
    padding: usize,
}

impl Geometry {
    fn y(&self) -> [usize; 4] {
        let out = |size: usize| (size + 2 * self.padding - self.w[2]) / self.stride + 1;
        [self.x[0], self.w[0], out(self.x[2]), out(self.x[3])]
    }

    fn key(&self, pass: Pass, device: DeviceId, f64: bool) -> ConvKey {
        ConvKey {
            pass,
            device,
            f64,
            x: self.x,
            w: self.w,
            stride: self.stride,
            padding: self.padding,
        }
    }
}

fn dims4(layout: &Layout, what: &str) -> candle_core::Result<[usize; 4]> {
    if !layout.is_contiguous() {
        return Err(candle_core::Error::Msg(format!(
            "cuDNN op: {what} must be contiguous"
        )));
    }
    let (a, b, c, d) = layout.shape().dims4()?;
    Ok([a, b, c, d])
}

/// The deterministic algorithms of cuDNN's heuristic ranking for one pass, best first
/// (computed once per thread and key).
fn choices(key: ConvKey, h: &Handle, d: &ConvDescs) -> candle_core::Result<Vec<Choice>> {
    if let Some(c) = CHOICES.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(c);
    }
    let ok = sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
    let det = sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC;
    let mut count = 0i32;
    // SAFETY: live handle and descriptors; each buffer holds the requested count.
    let found: Vec<Choice> = unsafe {
        match key.pass {
            Pass::Forward => {
                let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); 16];
                result::get_convolution_forward_algorithm(
                    h.0,
                    d.x.0,
                    d.w.0,
                    d.conv.0,
                    d.y.0,
                    perf.len() as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                )?;
                perf[..count.max(0) as usize]
                    .iter()
                    .filter(|p| p.status == ok && p.determinism == det)
                    .map(|p| Choice {
                        algo: Algo::Forward(p.algo),
                        math: p.mathType,
                    })
                    .collect()
            }
            Pass::BackwardData => {
                let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); 16];
                result::get_convolution_backward_data_algorithm(
                    h.0,
                    d.w.0,
                    d.y.0,
                    d.conv.0,
                    d.x.0,
                    perf.len() as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                )?;
                perf[..count.max(0) as usize]
                    .iter()
                    .filter(|p| p.status == ok && p.determinism == det)
                    .map(|p| Choice {
                        algo: Algo::BackwardData(p.algo),
                        math: p.mathType,
                    })
                    .collect()
            }
            Pass::BackwardFilter => {
                let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); 16];
                result::get_convolution_backward_filter_algorithm(
                    h.0,
                    d.x.0,
                    d.y.0,
                    d.conv.0,
                    d.w.0,
                    perf.len() as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                )?;
                perf[..count.max(0) as usize]
                    .iter()
                    .filter(|p| p.status == ok && p.determinism == det)
                    .map(|p| Choice {
                        algo: Algo::BackwardFilter(p.algo),
                        math: p.mathType,
                    })
                    .collect()
            }
        }
    };
    if found.is_empty() {
        return Err(candle_core::Error::Msg(format!(
            "cuDNN offers no deterministic algorithm for {key:?}"
        )));
    }
    CHOICES.with(|c| c.borrow_mut().insert(key, found.clone()));
    Ok(found)
}

/// Runs one convolution pass: `a` and `b` are its two inputs (forward: x, w; backward data:
/// ∂y, w; backward filter: x, ∂y), the output is the third tensor (y, ∂x, ∂w), `out_len`
/// values. The deterministic algorithms are tried in cuDNN's ranking order until one's
/// workspace can be allocated and it runs.
fn run_pass<T: Float>(
    pass: Pass,
    g: &Geometry,
    dev: &CudaDevice,
    a: &CudaView<T>,
    b: &CudaView<T>,
    out_len: usize,
) -> candle_core::Result<CudaSlice<T>> {
    let h = handle(dev)?;
    let d = ConvDescs::new::<T>(g)?;
    let stream = dev.cuda_stream();
    // SAFETY: the output is fully written by the pass (beta = 0).
    let mut out = unsafe { dev.alloc::<T>(out_len)? };
    let (one, zero) = (T::ONE, T::ZERO);
    let (alpha, beta) = (
        &one as *const T as *const c_void,
        &zero as *const T as *const c_void,
    );
    let mut last = None;
    for choice in choices(g.key(pass, dev.id(), T::IS_F64), &h, &d)? {
        d.conv.set_math(choice.math)?;
        // SAFETY: live handle and descriptors; the algorithm comes from cuDNN's own ranking.
        let size = unsafe {
            match choice.algo {
                Algo::Forward(algo) => result::get_convolution_forward_workspace_size(
                    h.0, d.x.0, d.w.0, d.conv.0, d.y.0, algo,
                ),
                Algo::BackwardData(algo) => result::get_convolution_backward_data_workspace_size(
                    h.0, d.w.0, d.y.0, d.conv.0, d.x.0, algo,
                ),
                Algo::BackwardFilter(algo) => {
                    result::get_convolution_backward_filter_workspace_size(
                        h.0, d.x.0, d.y.0, d.conv.0, d.w.0, algo,
                    )
                }
            }
        };
        let size = match size {
            Ok(s) => s,
            Err(e) => {
                last = Some(candle_core::Error::wrap(e));
                continue;
            }
        };
        // SAFETY: cuDNN's scratch memory, never read before it writes it.
        let mut workspace = match unsafe { dev.alloc::<u8>(size.max(1)) } {
            Ok(w) => w,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let (pa, _ga) = a.device_ptr(&stream);
        let (pb, _gb) = b.device_ptr(&stream);
        let (po, _go) = out.device_ptr_mut(&stream);
        let (pw, _gw) = workspace.device_ptr_mut(&stream);
        let (pa, pb) = (pa as *const c_void, pb as *const c_void);
        let (po, pw) = (po as *mut c_void, pw as *mut c_void);
        // SAFETY: the descriptors describe the packed buffers passed with them; the workspace
        // has the size cuDNN asked for.
        let status = unsafe {
            match choice.algo {
                Algo::Forward(algo) => result::convolution_forward(
                    h.0, alpha, d.x.0, pa, d.w.0, pb, d.conv.0, algo, pw, size, beta, d.y.0, po,
                ),
                Algo::BackwardData(algo) => result::convolution_backward_data(
                    h.0, alpha, d.w.0, pb, d.y.0, pa, d.conv.0, algo, pw, size, beta, d.x.0, po,
                ),
                Algo::BackwardFilter(algo) => result::convolution_backward_filter(
                    h.0, alpha, d.x.0, pa, d.y.0, pb, d.conv.0, algo, pw, size, beta, d.w.0, po,
                ),
            }
        };
        match status {
            Ok(()) => {
                drop((_ga, _gb, _go, _gw));
                return Ok(out);
            }
            Err(e) => last = Some(candle_core::Error::wrap(e)),
        }
    }
    Err(last
        .unwrap_or_else(|| candle_core::Error::Msg("cuDNN convolution: no algorithm ran".into())))
}

/// Wraps the slice that `f32` or `f64` computes, by the storage's type.
fn by_dtype(
    dtype: DType,
    dev: &CudaDevice,
    what: &str,
    f32: impl FnOnce() -> candle_core::Result<CudaSlice<f32>>,
    f64: impl FnOnce() -> candle_core::Result<CudaSlice<f64>>,
) -> candle_core::Result<CudaStorage> {
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(f32()?, dev.clone()),
        DType::F64 => CudaStorage::wrap_cuda_slice(f64()?, dev.clone()),
        other => {
            return Err(candle_core::Error::Msg(format!(
                "{what}: cuDNN path for f32/f64, not {other:?}"
            )))
        }
    })
}

/// One pass of a convolution as an op of its two inputs: forward `(x, w) → y` (whose backward
/// is the two others), backward data `(∂y, w) → ∂x`, backward filter `(x, ∂y) → ∂w`.
struct ConvPass {
    pass: Pass,
    stride: usize,
    padding: usize,
    /// The output's shape where the inputs do not give it: `∂x`'s (backward data), `∂w`'s
    /// (backward filter); unused by the forward pass.
    out: [usize; 4],
}

impl ConvPass {
    /// The convolution's shapes and the pass's output shape, from its inputs' layouts.
    fn geometry(&self, a: &Layout, b: &Layout) -> candle_core::Result<(Geometry, [usize; 4])> {
        let (stride, padding) = (self.stride, self.padding);
        let (g, out, dy) = match self.pass {
            Pass::Forward => {
                let (x, w) = (dims4(a, "the convolution input")?, dims4(b, "the kernel")?);
                let g = Geometry {
                    x,
                    w,
                    stride,
                    padding,
                };
                (g, g.y(), None)
            }
            Pass::BackwardData => {
                let w = dims4(b, "the kernel")?;
                let g = Geometry {
                    x: self.out,
                    w,
                    stride,
                    padding,
                };
                (g, self.out, Some(dims4(a, "the output gradient")?))
            }
            Pass::BackwardFilter => {
                let x = dims4(a, "the convolution input")?;
                let g = Geometry {
                    x,
                    w: self.out,
                    stride,
                    padding,
                };
                (g, self.out, Some(dims4(b, "the output gradient")?))
            }
        };
        match dy {
            Some(dy) if dy != g.y() => Err(candle_core::Error::Msg(format!(
                "cuDNN conv2d backward: output gradient {dy:?}, expected {:?}",
                g.y()
            ))),
            _ => Ok((g, out)),
        }
    }
}

impl CustomOp2 for ConvPass {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "rankwise-cudnn-conv2d",
            Pass::BackwardData => "rankwise-cudnn-conv2d-backward-data",
            Pass::BackwardFilter => "rankwise-cudnn-conv2d-backward-filter",
        }
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
        let (g, out) = self.geometry(al, bl)?;
        let len = out.iter().product();
        let dev = a.device().clone();
        let storage = by_dtype(
            a.dtype(),
            &dev,
            self.name(),
            || run_pass::<f32>(self.pass, &g, &dev, &view(a, al)?, &view(b, bl)?, len),
            || run_pass::<f64>(self.pass, &g, &dev, &view(a, al)?, &view(b, bl)?, len),
        )?;
        Ok((storage, Shape::from(out.to_vec())))
    }

    /// The forward pass's backward (the backward passes are applied without one).
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let pass = |pass: Pass, out: &Tensor| -> candle_core::Result<ConvPass> {
            let (a, b, c, d) = out.dims4()?;
            Ok(ConvPass {
                pass,
                stride: self.stride,
                padding: self.padding,
                out: [a, b, c, d],
            })
        };
        let dx = if x.track_op() {
            Some(grad.apply_op2_no_bwd(w, &pass(Pass::BackwardData, x)?)?)
        } else {
            None
        };
        let dw = if w.track_op() {
            Some(x.apply_op2_no_bwd(&grad, &pass(Pass::BackwardFilter, w)?)?)
        } else {
            None
        };
        Ok((dx, dw))
    }
}

/// Batch normalisation's training forward: `(x, γ, β) → y`, saving the batch statistics.
struct BatchNormTrain {
    eps: f64,
    saved: Saved,
}

/// The descriptors of one batch normalisation: the activations and the `1 × C × 1 × 1`
/// parameters and statistics.
fn bn_descs<T: Float>(x: [usize; 4]) -> candle_core::Result<(TensorDesc, TensorDesc)> {
    Ok((
        TensorDesc::new(T::CUDNN, x)?,
        TensorDesc::new(T::CUDNN, [1, x[1], 1, 1])?,
    ))
}

fn bn_forward<T: Float>(
    eps: f64,
    dev: &CudaDevice,
    x: &CudaView<T>,
    dims: [usize; 4],
    weight: &CudaView<T>,
    bias: &CudaView<T>,
) -> candle_core::Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let h = handle(dev)?;
    let (xd, pd) = bn_descs::<T>(dims)?;
    let stream = dev.cuda_stream();
    let c = dims[1];
    // SAFETY: all three are fully written by cuDNN.
    let (mut y, mut mean, mut inv_std) = unsafe {
        (
            dev.alloc::<T>(dims.iter().product())?,
            dev.alloc::<T>(c)?,
            dev.alloc::<T>(c)?,
        )
    };
    let (one, zero) = (T::ONE, T::ZERO);
    {
        let (px, _gx) = x.device_ptr(&stream);
        let (pw, _gw) = weight.device_ptr(&stream);
        let (pb, _gb) = bias.device_ptr(&stream);
        let (py, _gy) = y.device_ptr_mut(&stream);
        let (pm, _gm) = mean.device_ptr_mut(&stream);
        let (pv, _gv) = inv_std.device_ptr_mut(&stream);
        // SAFETY: live handle and descriptors describing the packed buffers; the running
        // averages are left to the caller (both null, which cuDNN allows).
        unsafe {
            sys::cudnnBatchNormalizationForwardTraining(
                h.0,
                sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                &one as *const T as *const c_void,
                &zero as *const T as *const c_void,
                xd.0,
                px as *const c_void,
                xd.0,
                py as *mut c_void,
                pd.0,
                pw as *const c_void,
                pb as *const c_void,
                0.0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                eps,
                pm as *mut c_void,
                pv as *mut c_void,
            )
            .result()?;
        }
    }
    let wrap = |slice| CudaStorage::wrap_cuda_slice(slice, dev.clone());
    Ok((wrap(y), wrap(mean), wrap(inv_std)))
}

impl CustomOp3 for BatchNormTrain {
    fn name(&self) -> &'static str {
        "rankwise-cudnn-batch-norm"
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
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = dims4(xl, "the batch-norm input")?;
        let dev = x.device().clone();
        let (y, mean, inv_std) = match x.dtype() {
            DType::F32 => bn_forward::<f32>(
                self.eps,
                &dev,
                &view(x, xl)?,
                dims,
                &view(w, wl)?,
                &view(b, bl)?,
            )?,
            DType::F64 => bn_forward::<f64>(
                self.eps,
                &dev,
                &view(x, xl)?,
                dims,
                &view(w, wl)?,
                &view(b, bl)?,
            )?,
            other => {
                return Err(candle_core::Error::Msg(format!(
                    "cuDNN batch norm: {other:?}"
                )))
            }
        };
        *self
            .saved
            .lock()
            .map_err(|_| candle_core::Error::Msg("batch-norm statistics lock poisoned".into()))? =
            Some((mean, inv_std));
        Ok((y, xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        // One op writes ∂x, ∂γ and ∂β (cuDNN computes them together) into one flat buffer.
        let packed = x.apply_op3_no_bwd(
            w,
            &grad,
            &BatchNormBackward {
                eps: self.eps,
                saved: self.saved.clone(),
            },
        )?;
        let (n, c) = (x.elem_count(), x.dim(1)?);
        let dx = packed.narrow(0, 0, n)?.reshape(x.shape())?;
        let dw = packed.narrow(0, n, c)?;
        let db = packed.narrow(0, n + c, c)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// Batch normalisation's backward: `(x, γ, ∂y) → [∂x | ∂γ | ∂β]` (flat), from the statistics
/// the forward pass saved.
struct BatchNormBackward {
    eps: f64,
    saved: Saved,
}

#[allow(clippy::too_many_arguments)]
fn bn_backward<T: Float>(
    eps: f64,
    dev: &CudaDevice,
    x: &CudaView<T>,
    dims: [usize; 4],
    weight: &CudaView<T>,
    dy: &CudaView<T>,
    mean: &CudaView<T>,
    inv_std: &CudaView<T>,
) -> candle_core::Result<CudaSlice<T>> {
    let h = handle(dev)?;
    let (xd, pd) = bn_descs::<T>(dims)?;
    let stream = dev.cuda_stream();
    let (n, c) = (dims.iter().product::<usize>(), dims[1]);
    // SAFETY: fully written by cuDNN (∂x, then ∂γ, then ∂β).
    let mut out = unsafe { dev.alloc::<T>(n + 2 * c)? };
    let (one, zero) = (T::ONE, T::ZERO);
    {
        let (px, _gx) = x.device_ptr(&stream);
        let (pw, _gw) = weight.device_ptr(&stream);
        let (pdy, _gdy) = dy.device_ptr(&stream);
        let (pm, _gm) = mean.device_ptr(&stream);
        let (pv, _gv) = inv_std.device_ptr(&stream);
        let (po, _go) = out.device_ptr_mut(&stream);
        let size = std::mem::size_of::<T>() as u64;
        // ∂x, ∂γ, ∂β: consecutive ranges of `out`.
        let (pdx, pdw, pdb) = (
            po as *mut c_void,
            (po + n as u64 * size) as *mut c_void,
            (po + (n + c) as u64 * size) as *mut c_void,
        );
        let (a, z) = (
            &one as *const T as *const c_void,
            &zero as *const T as *const c_void,
        );
        // SAFETY: live handle and descriptors describing the packed buffers; the three outputs
        // are disjoint ranges of `out`.
        unsafe {
            sys::cudnnBatchNormalizationBackward(
                h.0,
                sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                a,
                z,
                a,
                z,
                xd.0,
                px as *const c_void,
                xd.0,
                pdy as *const c_void,
                xd.0,
                pdx,
                pd.0,
                pw as *const c_void,
                pdw,
                pdb,
                eps,
                pm as *const c_void,
                pv as *const c_void,
            )
            .result()?;
        }
    }
    Ok(out)
}

impl CustomOp3 for BatchNormBackward {
    fn name(&self) -> &'static str {
        "rankwise-cudnn-batch-norm-backward"
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
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = dims4(xl, "the batch-norm input")?;
        if dims4(dyl, "the batch-norm output gradient")? != dims {
            return Err(candle_core::Error::Msg(
                "cuDNN batch norm backward: gradient and input shapes differ".into(),
            ));
        }
        let guard = self
            .saved
            .lock()
            .map_err(|_| candle_core::Error::Msg("batch-norm statistics lock poisoned".into()))?;
        let (mean, inv_std) = guard.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("cuDNN batch norm backward before its forward".into())
        })?;
        let whole = Layout::contiguous(dims[1]);
        let dev = x.device().clone();
        let len = dims.iter().product::<usize>() + 2 * dims[1];
        let out = by_dtype(
            x.dtype(),
            &dev,
            self.name(),
            || {
                bn_backward::<f32>(
                    self.eps,
                    &dev,
                    &view(x, xl)?,
                    dims,
                    &view(w, wl)?,
                    &view(dy, dyl)?,
                    &view(mean, &whole)?,
                    &view(inv_std, &whole)?,
                )
            },
            || {
                bn_backward::<f64>(
                    self.eps,
                    &dev,
                    &view(x, xl)?,
                    dims,
                    &view(w, wl)?,
                    &view(dy, dyl)?,
                    &view(mean, &whole)?,
                    &view(inv_std, &whole)?,
                )
            },
        )?;
        Ok((out, Shape::from(len)))
    }
}

/// Max pooling (`kernel × kernel`, `stride`, `padding`) by cuDNN
/// (`CUDNN_POOLING_MAX_DETERMINISTIC`), forward and backward; the graph keeps the input and the
/// output only, where the generic path (`super::layers::max_pool2d`) stacks every window
/// offset (9 copies of the output for ResNet's 3 × 3 stem pooling). The gradient of a window
/// goes to one of its maxima; the generic path's rule (the first in row-major order) can differ
/// only on exact ties, which in a ResNet follow a ReLU at 0, whose own gradient is 0 there.
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
    let x = x.contiguous()?;
    let op = MaxPool {
        kernel,
        stride,
        padding,
    };
    if !x.track_op() {
        return Ok(x.apply_op1_no_bwd(&op)?);
    }
    Ok(x.apply_op1(op)?)
}

struct PoolDesc(sys::cudnnPoolingDescriptor_t);

impl PoolDesc {
    fn new(kernel: usize, stride: usize, padding: usize) -> candle_core::Result<Self> {
        let d = PoolDesc(result::create_pooling_descriptor()?);
        let (k, s, p) = (kernel as i32, stride as i32, padding as i32);
        // SAFETY: a live descriptor.
        unsafe {
            sys::cudnnSetPooling2dDescriptor(
                d.0,
                sys::cudnnPoolingMode_t::CUDNN_POOLING_MAX_DETERMINISTIC,
                sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                k,
                k,
                p,
                p,
                s,
                s,
            )
            .result()?
        };
        Ok(d)
    }
}

impl Drop for PoolDesc {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = sys::cudnnDestroyPoolingDescriptor(self.0);
        }
    }
}

struct MaxPool {
    kernel: usize,
    stride: usize,
    padding: usize,
}

impl MaxPool {
    fn out_dims(&self, x: [usize; 4]) -> [usize; 4] {
        let out = |size: usize| (size + 2 * self.padding - self.kernel) / self.stride + 1;
        [x[0], x[1], out(x[2]), out(x[3])]
    }
}

fn pool_forward<T: Float>(
    p: &MaxPool,
    dev: &CudaDevice,
    x: &CudaView<T>,
    dims: [usize; 4],
) -> candle_core::Result<CudaSlice<T>> {
    let h = handle(dev)?;
    let out = p.out_dims(dims);
    let (xd, yd) = (
        TensorDesc::new(T::CUDNN, dims)?,
        TensorDesc::new(T::CUDNN, out)?,
    );
    let pd = PoolDesc::new(p.kernel, p.stride, p.padding)?;
    let stream = dev.cuda_stream();
    // SAFETY: fully written by cuDNN (beta = 0).
    let mut y = unsafe { dev.alloc::<T>(out.iter().product())? };
    let (one, zero) = (T::ONE, T::ZERO);
    {
        let (px, _gx) = x.device_ptr(&stream);
        let (py, _gy) = y.device_ptr_mut(&stream);
        // SAFETY: live handle and descriptors describing the packed buffers.
        unsafe {
            result::pooling_forward(
                h.0,
                pd.0,
                &one as *const T as *const c_void,
                xd.0,
                px as *const c_void,
                &zero as *const T as *const c_void,
                yd.0,
                py as *mut c_void,
            )?;
        }
    }
    Ok(y)
}

impl CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "rankwise-cudnn-max-pool"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(not_on_cpu(self.name()))
    }

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = dims4(xl, "the pooling input")?;
        let dev = x.device().clone();
        let y = by_dtype(
            x.dtype(),
            &dev,
            self.name(),
            || pool_forward::<f32>(self, &dev, &view(x, xl)?, dims),
            || pool_forward::<f64>(self, &dev, &view(x, xl)?, dims),
        )?;
        Ok((y, Shape::from(self.out_dims(dims).to_vec())))
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let back = MaxPoolBackward {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
        };
        Ok(Some(x.apply_op3_no_bwd(y, &grad, &back)?))
    }
}

/// `∂x` from `(x, y, ∂y)` of a max pooling: cuDNN's pooling backward.
struct MaxPoolBackward {
    kernel: usize,
    stride: usize,
    padding: usize,
}

fn pool_backward<T: Float>(
    p: &MaxPoolBackward,
    dev: &CudaDevice,
    (x, y, dy): (&CudaView<T>, &CudaView<T>, &CudaView<T>),
    dims: [usize; 4],
    out: [usize; 4],
) -> candle_core::Result<CudaSlice<T>> {
    let h = handle(dev)?;
    let (xd, yd) = (
        TensorDesc::new(T::CUDNN, dims)?,
        TensorDesc::new(T::CUDNN, out)?,
    );
    let pd = PoolDesc::new(p.kernel, p.stride, p.padding)?;
    let stream = dev.cuda_stream();
    // SAFETY: fully written by cuDNN (beta = 0).
    let mut dx = unsafe { dev.alloc::<T>(dims.iter().product())? };
    let (one, zero) = (T::ONE, T::ZERO);
    {
        let (px, _gx) = x.device_ptr(&stream);
        let (py, _gy) = y.device_ptr(&stream);
        let (pdy, _gdy) = dy.device_ptr(&stream);
        let (pdx, _gdx) = dx.device_ptr_mut(&stream);
        // SAFETY: live handle and descriptors describing the packed buffers.
        unsafe {
            sys::cudnnPoolingBackward(
                h.0,
                pd.0,
                &one as *const T as *const c_void,
                yd.0,
                py as *const c_void,
                yd.0,
                pdy as *const c_void,
                xd.0,
                px as *const c_void,
                &zero as *const T as *const c_void,
                xd.0,
                pdx as *mut c_void,
            )
            .result()?;
        }
    }
    Ok(dx)
}

impl CustomOp3 for MaxPoolBackward {
    fn name(&self) -> &'static str {
        "rankwise-cudnn-max-pool-backward"
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
        x: &CudaStorage,
        xl: &Layout,
        y: &CudaStorage,
        yl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = dims4(xl, "the pooling input")?;
        let out = dims4(yl, "the pooling output")?;
        if dims4(dyl, "the pooling output gradient")? != out {
            return Err(candle_core::Error::Msg(
                "cuDNN max pool backward: gradient and output shapes differ".into(),
            ));
        }
        let dev = x.device().clone();
        let dx = by_dtype(
            x.dtype(),
            &dev,
            self.name(),
            || {
                pool_backward::<f32>(
                    self,
                    &dev,
                    (&view(x, xl)?, &view(y, yl)?, &view(dy, dyl)?),
                    dims,
                    out,
                )
            },
            || {
                pool_backward::<f64>(
                    self,
                    &dev,
                    (&view(x, xl)?, &view(y, yl)?, &view(dy, dyl)?),
                    dims,
                    out,
                )
            },
        )?;
        Ok((dx, xl.shape().clone()))
    }
}

//! 2-D convolution for training on the CPU: im2col + one large GEMM, forward and backward.
//!
//! candle 0.11's CPU convolution reaches about 6 GFLOP/s on the small CNN's 3 × 3 layers where
//! its GEMM reaches 25–30 on the same machine, and back-propagates to the input with
//! `conv_transpose2d`, a direct loop 5–10× slower still (computed even for the images, which need
//! no gradient). Here, on the CPU, the convolution is a custom op built on the classic
//! formulation (Chellapilla et al., 2006; Caffe): the patches of a group of images are unfolded
//! into a `(C_in·K²) × (B·H'·W')` matrix (im2col) and, with `W` the kernel as `C_out × C_in·K²`
//! and `∂Y` the output gradient as `C_out × (B·H'·W')`,
//! * forward: `Y = W · cols`,
//! * kernel gradient: `∂W = ∂Y · colsᵀ` (computed as `∂Wᵀ = cols · ∂Yᵀ`, the orientation gemm
//!   runs faster, and transposed once),
//! * input gradient: `∂cols = Wᵀ · ∂Y`, folded back onto the image (col2im, a sum over the
//!   windows that read each pixel), skipped when the input needs no gradient.
//!
//! The batch is cut into [`PARTS`] contiguous parts of images, run in parallel; each thread
//! unfolds its part into its own buffer and calls a single-threaded GEMM (the `gemm` crate,
//! candle's own) on it, then writes its images' outputs. The unfold and product buffers are the
//! thread's scratch (`cpu::scratch`), kept from one call to the next instead of being
//! allocated and zero-filled at every layer. Handing the threads one part each,
//! rather than splitting every product, every unfold and every copy over the threads as
//! candle's ops do, also lets the unfold buffers be reused and skips the transposed copies of
//! the outputs (benches/train_throughput_vs_torch.md has the before/after). Within a
//! part, images are unfolded together while the matrix holds at most [`MAX_COLS_ELEMENTS`]
//! values, and the backward pass unfolds again rather than keeping the matrix. The kernel
//! gradient is one partial product per part, summed in part order, so the bits do not depend
//! on the number of threads (tested). Values and gradients equal a brute-force convolution to
//! 1e-10 in `f64` (tested).
//!
//! Other devices (CUDA) run candle's convolution forward, which is already im2col + one GEMM
//! there, but not its backward: candle differentiates a convolution into `conv_transpose2d`, a
//! direct loop on CUDA too, which made ResNet-50 training on an H200 20× slower than PyTorch
//! (benches/gpu/). [`conv2d_device`] keeps candle's forward and its kernel gradient (a
//! convolution of the input by the output gradient, im2col + GEMM again) and computes the input
//! gradient as a *forward* convolution too: the output gradient, with `stride − 1` zeros inserted
//! between its entries, convolved with the kernel flipped in space and transposed in channels,
//! padded by `K − 1 − padding` (the transposed convolution written as a convolution, Dumoulin &
//! Visin 2016, §4). The input gradient is skipped for inputs that need none (the images).

use crate::cpu::gemm::{gemm_into, transposed, Matrix};
use crate::cpu::scratch::{prefix, with_buffers};
use crate::cpu::{slice, with_values};
use crate::error::{Error, Result};
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

/// Largest number of values in one unfolded patch matrix (64 MiB of `f32`).
pub const MAX_COLS_ELEMENTS: usize = 1 << 24;

/// `x` (`B × C_in × H × W`) convolved with `kernel` (`C_out × C_in × K × K`), symmetric zero
/// `padding`, `stride`, no dilation, one group (PyTorch's `F.conv2d`, no bias).
pub fn conv2d(x: &Tensor, kernel: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    conv2d_grouped(x, kernel, stride, padding, MAX_COLS_ELEMENTS)
}

/// [`conv2d`] with at most `max_cols` values per unfolded matrix (at least one image).
fn conv2d_grouped(
    x: &Tensor,
    kernel: &Tensor,
    stride: usize,
    padding: usize,
    max_cols: usize,
) -> Result<Tensor> {
    let (_, _, kh, kw) = kernel.dims4()?;
    let (_, c, _, _) = x.dims4()?;
    if kh != kw || kh == 0 || padding > kh - 1 || stride == 0 || kernel.dim(1)? != c {
        return Err(Error::Shape(format!(
            "convolution of {:?} by {:?} (stride {stride}, padding {padding}): needs a square \
             kernel with padding < kernel and matching input channels",
            x.dims(),
            kernel.dims()
        )));
    }
    let geometry = Geometry::new(x, kernel, stride, padding, max_cols)?;
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Ok(x.conv2d(kernel, padding, stride, 1, 1)?);
    }
    #[cfg(feature = "cudnn")]
    if super::cudnn::applies(x) {
        return super::cudnn::conv2d(x, kernel, stride, padding);
    }
    if !x.device().is_cpu() {
        return conv2d_device(x, kernel, stride, padding);
    }
    // The op computes its value in `cpu_fwd`, reading the inputs' buffers in place (they are
    // made contiguous here): computing it beforehand, as this function did, made candle's
    // `cpu_fwd` hand back a clone of it, one more copy of every convolution's output at every
    // training step (bit-identical checkpoints either way, tested by the fixed-seed runs).
    let (x, kernel) = (x.contiguous()?, kernel.contiguous()?);
    let op = ConvOp { geometry };
    if !(x.track_op() || kernel.track_op()) {
        return Ok(x.apply_op2_no_bwd(&kernel, &op)?);
    }
    Ok(x.apply_op2(&kernel, op)?)
}

/// The convolution of [`conv2d`] on any device through candle's forward convolution (im2col +
/// GEMM on CUDA), with a backward pass made of forward convolutions (see the module docs); the
/// path of every device but the CPU, callable on the CPU for tests.
pub fn conv2d_device(x: &Tensor, kernel: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let value = x.detach().conv2d(&kernel.detach(), padding, stride, 1, 1)?;
    if !(x.track_op() || kernel.track_op()) {
        return Ok(value);
    }
    // The forward value is candle's; the backward pass is [`device_backward`].
    crate::attach::attach2(x, kernel, &value, move |x, kernel, grad| {
        let (gx, gk) = device_backward(x, kernel, grad, stride, padding)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((gx, Some(gk)))
    })
}

/// `(∂x, ∂kernel)` of `y = conv2d(x, kernel, stride, padding)` from `∂y`, with forward
/// convolutions only; `∂x` is `None` when `x` needs no gradient.
fn device_backward(
    x: &Tensor,
    kernel: &Tensor,
    grad: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<(Option<Tensor>, Tensor)> {
    let need_input_grad = x.track_op();
    let (x, kernel, grad) = (x.detach(), kernel.detach(), grad.detach().contiguous()?);
    let (_, _, h, w) = x.dims4()?;
    let (_, _, k, _) = kernel.dims4()?;
    let (b, c_out, ho, wo) = grad.dims4()?;
    // ∂kernel[o, i] = Σ_b x[b, i] ⋆ ∂y[b, o] dilated by the stride: a convolution of the
    // channels-as-batch input by the channels-as-batch gradient (candle's own formulation). Its
    // result can be one row/column larger than the kernel when the stride skips the last ones.
    let gk = x
        .transpose(0, 1)?
        .conv2d(&grad.transpose(0, 1)?, padding, 1, stride, 1)?
        .transpose(0, 1)?
        .narrow(2, 0, k)?
        .narrow(3, 0, k)?
        .contiguous()?;
    if !need_input_grad {
        return Ok((None, gk));
    }
    // ∂x = (∂y with stride − 1 zeros between entries) ⋆ flip(kernel)ᵀ, padded by K − 1 − p.
    // When the stride does not divide H + 2p − K, the windows also read r = (H + 2p − K) mod s
    // rows past the last one that starts a window: the dilated gradient gets r zero rows (and
    // columns) at the end, the "output padding" of a transposed convolution.
    let (rh, rw) = (
        (h + 2 * padding - k) % stride,
        (w + 2 * padding - k) % stride,
    );
    let dilated = if stride == 1 {
        grad
    } else {
        // (B, C, Ho, Wo) → (B, C, Ho·s, Wo·s) with the entries at offset 0 of each s × s block,
        // cut to the (Ho − 1)·s + 1 + r rows and columns the windows read.
        let zeros = grad.zeros_like()?;
        let mut rows = vec![grad.unsqueeze(3)?];
        for _ in 1..stride {
            rows.push(zeros.unsqueeze(3)?);
        }
        let rows = Tensor::cat(&rows, 3)?.reshape((b, c_out, ho * stride, wo))?;
        let zeros = rows.zeros_like()?;
        let mut cols = vec![rows.unsqueeze(4)?];
        for _ in 1..stride {
            cols.push(zeros.unsqueeze(4)?);
        }
        Tensor::cat(&cols, 4)?
            .reshape((b, c_out, ho * stride, wo * stride))?
            .narrow(2, 0, (ho - 1) * stride + 1 + rh)?
            .narrow(3, 0, (wo - 1) * stride + 1 + rw)?
            .contiguous()?
    };
    let reversed = Tensor::from_vec(
        (0..k as u32).rev().collect::<Vec<u32>>(),
        k,
        kernel.device(),
    )?;
    let flipped = kernel
        .index_select(&reversed, 2)?
        .index_select(&reversed, 3)?
        .transpose(0, 1)?
        .contiguous()?;
    let gx = dilated.conv2d(&flipped, k - 1 - padding, 1, 1, 1)?;
    debug_assert_eq!(gx.dims4()?, (b, x.dim(1)?, h, w));
    Ok((Some(gx), gk))
}

/// Sizes of one convolution.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    b: usize,
    c: usize,
    h: usize,
    w: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    padding: usize,
    ho: usize,
    wo: usize,
    max_cols: usize,
}

impl Geometry {
    fn new(
        x: &Tensor,
        kernel: &Tensor,
        stride: usize,
        padding: usize,
        max_cols: usize,
    ) -> Result<Self> {
        let (b, c, h, w) = x.dims4()?;
        let (c_out, _, k, _) = kernel.dims4()?;
        if h + 2 * padding < k || w + 2 * padding < k {
            return Err(Error::Shape(format!(
                "a {k}×{k} kernel with padding {padding} does not fit a {h}×{w} input"
            )));
        }
        Ok(Geometry {
            b,
            c,
            h,
            w,
            c_out,
            k,
            stride,
            padding,
            ho: (h + 2 * padding - k) / stride + 1,
            wo: (w + 2 * padding - k) / stride + 1,
            max_cols,
        })
    }

    /// Output positions per image.
    fn rows(&self) -> usize {
        self.ho * self.wo
    }

    /// Values per patch, `C_in·K²`.
    fn patch(&self) -> usize {
        self.c * self.k * self.k
    }

    /// Values per input image.
    fn image(&self) -> usize {
        self.c * self.h * self.w
    }

    /// Values per output image.
    fn out_image(&self) -> usize {
        self.c_out * self.rows()
    }

    /// The batch cut into at most [`PARTS`] contiguous, balanced ranges of images: the unit of
    /// parallel work, each part run by one thread with single-threaded matrix products.
    fn parts(&self) -> Vec<std::ops::Range<usize>> {
        let n = self.b.min(PARTS);
        (0..n)
            .map(|i| (i * self.b / n)..((i + 1) * self.b / n))
            .collect()
    }

    /// Ranges of images of `part` unfolded together: at most `max_cols` values per unfolded
    /// matrix, at least one image.
    fn chunks(&self, part: std::ops::Range<usize>) -> impl Iterator<Item = std::ops::Range<usize>> {
        let per_image = (self.rows() * self.patch()).max(1);
        let n = (self.max_cols / per_image).max(1);
        let end = part.end;
        part.step_by(n).map(move |s| s..(s + n).min(end))
    }
}

/// Parts the batch is cut into (see `Geometry::parts`). Fixed rather than the thread count:
/// the kernel gradient is a sum of one partial product per part, added in part order, so the
/// bits of a training run do not depend on the machine's cores. 16 keeps 2–16 threads busy
/// with balanced work (a part is 4 images at batch 64).
pub const PARTS: usize = 16;

/// `lo..hi`: the outputs `o` whose input `o·s + offset − p` lies in `0..size`.
#[inline]
fn valid_range(size: usize, out: usize, offset: usize, g: &Geometry) -> (usize, usize) {
    let (s, p) = (g.stride, g.padding);
    let lo = if offset >= p {
        0
    } else {
        (p - offset).div_ceil(s)
    };
    let hi = if size + p > offset {
        ((size - 1 + p - offset) / s + 1).min(out)
    } else {
        0
    };
    (lo, hi.max(lo))
}

/// The patches of images `imgs` of `x` (`B·C·H·W` values), transposed, written to `cols`: a
/// row-major `(C·K²) × (n·H'·W')` matrix whose row `(c, ky, kx)` (the kernel's column order)
/// holds, for every image and output position, the pixel that kernel tap reads (0 in the
/// padding).
fn im2col<T: WithDType>(x: &[T], g: &Geometry, imgs: std::ops::Range<usize>, cols: &mut [T]) {
    let (rows, k) = (g.rows(), g.k);
    let n = imgs.len();
    let image = g.image();
    // Every value is written below (the padding's zeros explicitly), so a reused buffer is not
    // cleared first: zeroing it whole cost as much as the copies.
    debug_assert_eq!(cols.len(), g.patch() * n * rows);
    for (col, out) in cols.chunks_mut(n * rows).enumerate() {
        let (ci, ky, kx) = (col / (k * k), (col / k) % k, col % k);
        let (ylo, yhi) = valid_range(g.h, g.ho, ky, g);
        let (xlo, xhi) = valid_range(g.w, g.wo, kx, g);
        for (j, i) in imgs.clone().enumerate() {
            let plane = &x[i * image + ci * g.h * g.w..i * image + (ci + 1) * g.h * g.w];
            let image_out = &mut out[j * rows..(j + 1) * rows];
            image_out[..ylo * g.wo].fill(T::zero());
            image_out[yhi * g.wo..].fill(T::zero());
            if let Some(block) = same_width_block(g, ylo, yhi, ky, kx, plane.len()) {
                let dst = &mut image_out[ylo * g.wo..yhi * g.wo];
                dst[block.dst.clone()].copy_from_slice(&plane[block.src]);
                dst[..block.dst.start].fill(T::zero());
                dst[block.dst.end..].fill(T::zero());
                for row in dst.chunks_exact_mut(g.wo) {
                    for ox in (0..xlo).chain(xhi..g.wo) {
                        row[ox] = T::zero();
                    }
                }
                continue;
            }
            for oy in ylo..yhi {
                let src = &plane[(oy * g.stride + ky - g.padding) * g.w..];
                let dst = &mut image_out[oy * g.wo..(oy + 1) * g.wo];
                dst[..xlo].fill(T::zero());
                dst[xhi..].fill(T::zero());
                if g.stride == 1 {
                    let start = xlo + kx - g.padding;
                    dst[xlo..xhi].copy_from_slice(&src[start..start + (xhi - xlo)]);
                } else {
                    for ox in xlo..xhi {
                        dst[ox] = src[ox * g.stride + kx - g.padding];
                    }
                }
            }
        }
    }
}

/// Where a kernel tap's rows `ylo..yhi` lie in one image plane of `plane_len` values: the
/// part `dst` of the tap's `(yhi − ylo)·W'` outputs that reads the plane's values `src`, for
/// stride-1 convolutions that keep the width (`W' = W`, the 3 × 3 padding-1 and 1 × 1 layers of
/// the small CNN and the ResNets); `None` otherwise.
///
/// With `W' = W` consecutive outputs of the tap read consecutive pixels, so all of its rows
/// are one copy (im2col) or one sum (col2im) instead of one per row: the rows are 4–56 values
/// long, and per-row copies and fills made im2col 13 % of a small-CNN training step (perf, AMD
/// EPYC 2-core VM, 2026-11-27). The block also covers the positions whose tap falls in the
/// padding left or right; those read the neighbouring row's pixels and are set to zero
/// (im2col) or skipped by zeroing their gradients first (col2im).
fn same_width_block(
    g: &Geometry,
    ylo: usize,
    yhi: usize,
    ky: usize,
    kx: usize,
    plane_len: usize,
) -> Option<SameWidthBlock> {
    if g.stride != 1 || g.wo != g.w || ylo >= yhi {
        return None;
    }
    // Output (oy, ox) reads pixel (oy + ky − p)·W + ox + kx − p; ylo keeps the row in range.
    let start = ((ylo + ky - g.padding) * g.w) as isize + kx as isize - g.padding as isize;
    let len = ((yhi - ylo) * g.w) as isize;
    let lo = (-start).clamp(0, len);
    let hi = (plane_len as isize - start).clamp(lo, len);
    Some(SameWidthBlock {
        dst: lo as usize..hi as usize,
        src: (start + lo) as usize..(start + hi) as usize,
    })
}

/// See [`same_width_block`].
struct SameWidthBlock {
    dst: std::ops::Range<usize>,
    src: std::ops::Range<usize>,
}

/// Adds the patch gradients `gcols` (laid out as [`im2col`]'s matrix for the same images) onto
/// their pixels in `dx` (`n·C·H·W` values for those images).
///
/// `gcols` is scratch: the gradients of taps that fall in the padding may be zeroed.
fn col2im<T: WithDType>(gcols: &mut [T], g: &Geometry, dx: &mut [T]) {
    let (rows, k) = (g.rows(), g.k);
    let image = g.image();
    let n = dx.len() / image;
    for (j, img) in dx.chunks_mut(image).enumerate() {
        for col in 0..g.patch() {
            let (ci, ky, kx) = (col / (k * k), (col / k) % k, col % k);
            let (ylo, yhi) = valid_range(g.h, g.ho, ky, g);
            let (xlo, xhi) = valid_range(g.w, g.wo, kx, g);
            let src = &mut gcols[col * n * rows + j * rows..col * n * rows + (j + 1) * rows];
            let plane = &mut img[ci * g.h * g.w..(ci + 1) * g.h * g.w];
            if let Some(block) = same_width_block(g, ylo, yhi, ky, kx, plane.len()) {
                let src = &mut src[ylo * g.wo..yhi * g.wo];
                // Zero, not skip: adding +0.0 leaves every sum's bits as they were (the
                // gradients start at +0.0, so none is −0.0).
                for row in src.chunks_exact_mut(g.wo) {
                    for ox in (0..xlo).chain(xhi..g.wo) {
                        row[ox] = T::zero();
                    }
                }
                for (d, r) in plane[block.src].iter_mut().zip(&src[block.dst]) {
                    *d += *r;
                }
                continue;
            }
            for oy in ylo..yhi {
                let dst = &mut plane[(oy * g.stride + ky - g.padding) * g.w..];
                let row = &src[oy * g.wo..(oy + 1) * g.wo];
                if g.stride == 1 {
                    let start = xlo + kx - g.padding;
                    for (d, r) in dst[start..start + (xhi - xlo)]
                        .iter_mut()
                        .zip(&row[xlo..xhi])
                    {
                        *d += *r;
                    }
                } else {
                    for ox in xlo..xhi {
                        dst[ox * g.stride + kx - g.padding] += row[ox];
                    }
                }
            }
        }
    }
}

/// The layout change between `n` NCHW output images (`C_out·H'·W'` values each) and the
/// `C_out × (n·H'·W')` matrix of the products below: `(image range, matrix range)` of each
/// image's channel, copied one way (forward) or the other (backward).
fn regrouped(
    g: &Geometry,
    n: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> + '_ {
    let rows = g.rows();
    (0..n).flat_map(move |j| {
        (0..g.c_out).map(move |o| {
            let image = (j * g.c_out + o) * rows;
            let column = o * n * rows + j * rows;
            (image..image + rows, column..column + rows)
        })
    })
}

/// Splits `data` into consecutive slices of `part.len() · per` values, one per part.
fn split_parts<'a, T>(
    mut data: &'a mut [T],
    parts: &[std::ops::Range<usize>],
    per: usize,
) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let (head, tail) = data.split_at_mut(p.len() * per);
        out.push(head);
        data = tail;
    }
    out
}

/// `conv2d` of the `B × C × H × W` values `xs` by the `C_out × C·K²` row-major kernel `wmat`:
/// the `B × C_out × H' × W'` output values.
fn forward<T: WithDType>(xs: &[T], wmat: &[T], g: &Geometry) -> Vec<T> {
    let parts = g.parts();
    let mut y = vec![T::zero(); g.b * g.out_image()];
    split_parts(&mut y, &parts, g.out_image())
        .into_par_iter()
        .zip(parts.par_iter())
        .for_each(|(out, part)| {
            with_buffers::<T, _, 2>(|[cols, prod]| {
                for imgs in g.chunks(part.clone()) {
                    let n = imgs.len();
                    let cols = prefix(cols, g.patch() * n * g.rows());
                    im2col(xs, g, imgs.clone(), cols);
                    let prod = prefix(prod, g.c_out * n * g.rows());
                    // Y = W · cols, C_out × (n·H'·W').
                    gemm_into(
                        prod,
                        Matrix::row_major(wmat, g.c_out, g.patch()),
                        Matrix::row_major(cols, g.patch(), n * g.rows()),
                        false,
                        1,
                    );
                    let out = &mut out[(imgs.start - part.start) * g.out_image()..];
                    for (image, column) in regrouped(g, n) {
                        out[image].copy_from_slice(&prod[column]);
                    }
                }
            })
        });
    y
}

/// The custom op: carries the geometry.
struct ConvOp {
    geometry: Geometry,
}

impl ConvOp {
    fn backward<T: WithDType>(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let g = &self.geometry;
        let dev = x.device();
        let wmat: Vec<T> = kernel.flatten_all()?.to_vec1()?;
        let (want_x, want_k) = (x.track_op(), kernel.track_op());
        let parts = g.parts();
        let mut dx = vec![T::zero(); if want_x { g.b * g.image() } else { 0 }];
        let dx_parts: Vec<Option<&mut [T]>> = if want_x {
            split_parts(&mut dx, &parts, g.image())
                .into_iter()
                .map(Some)
                .collect()
        } else {
            parts.iter().map(|_| None).collect()
        };
        let weights = g.c_out * g.patch();
        // ∂Y (B × C_out × H'·W') and x are read in place.
        let partials: Vec<Vec<T>> = with_values::<T, _>(grad, |gys| {
            with_values::<T, _>(x, |xs| {
                Ok(dx_parts
                    .into_par_iter()
                    .zip(parts.par_iter())
                    .map(|(mut dx_part, part)| {
                        let mut dw_t = vec![T::zero(); if want_k { weights } else { 0 }];
                        with_buffers::<T, _, 3>(|[cols, gy, gcols]| {
                            let mut first = true;
                            for imgs in g.chunks(part.clone()) {
                                let n = imgs.len();
                                let cn = n * g.rows();
                                // ∂Y of these images as C_out × (n·H'·W').
                                let gy = prefix(gy, g.c_out * cn);
                                let images = &gys[imgs.start * g.out_image()..];
                                for (image, column) in regrouped(g, n) {
                                    gy[column].copy_from_slice(&images[image]);
                                }
                                let gy_m = Matrix::row_major(gy, g.c_out, cn);
                                if want_k {
                                    // ∂Wᵀ (+)= cols · ∂Yᵀ, a `C·K² × C_out` matrix: gemm runs this
                                    // orientation (transposed right operand) 1.0–2× faster than
                                    // ∂Y · colsᵀ (transposed left operand) on four of the small
                                    // CNN's shapes (AVX-512 microbenchmark, benches/
                                    // train_throughput_vs_torch.md); the sum below transposes back.
                                    let cols = prefix(cols, g.patch() * cn);
                                    im2col(xs, g, imgs.clone(), cols);
                                    let cols_m = Matrix::row_major(cols, g.patch(), cn);
                                    gemm_into(&mut dw_t, cols_m, gy_m.t(), !first, 1);
                                    first = false;
                                }
                                if let Some(dx_part) = dx_part.as_deref_mut() {
                                    // ∂cols = Wᵀ · ∂Y, folded back onto the images.
                                    let gcols = prefix(gcols, g.patch() * cn);
                                    let w_m = Matrix::row_major(&wmat, g.c_out, g.patch());
                                    gemm_into(gcols, w_m.t(), gy_m, false, 1);
                                    let at = (imgs.start - part.start) * g.image();
                                    col2im(gcols, g, &mut dx_part[at..at + n * g.image()]);
                                }
                            }
                        });
                        dw_t
                    })
                    .collect())
            })
        })?;
        let grad_x = if want_x {
            Some(Tensor::from_vec(dx, x.shape(), dev)?)
        } else {
            None
        };
        let grad_k = if want_k {
            // Σ over the parts in part order, whatever the number of threads, then ∂Wᵀ
            // (`C·K² × C_out`) transposed back to the kernel's layout.
            let mut dw_t = vec![T::zero(); weights];
            dw_t.par_chunks_mut(4096).enumerate().for_each(|(i, out)| {
                for p in &partials {
                    for (o, v) in out.iter_mut().zip(&p[i * 4096..]) {
                        *o += *v;
                    }
                }
            });
            let dw = transposed(&dw_t, g.patch(), g.c_out);
            Some(Tensor::from_vec(dw, kernel.shape(), dev)?)
        } else {
            None
        };
        Ok((grad_x, grad_k))
    }
}

impl CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "rankwise-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let g = &self.geometry;
        let y = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(forward(slice(s1, l1)?, slice(s2, l2)?, g)),
            CpuStorage::F64(_) => CpuStorage::F64(forward(slice(s1, l1)?, slice(s2, l2)?, g)),
            _ => candle_core::bail!("rankwise-conv2d: only f32 and f64 are supported"),
        };
        Ok((y, Shape::from((g.b, g.c_out, g.ho, g.wo))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        match x.dtype() {
            DType::F32 => self.backward::<f32>(x, kernel, grad),
            DType::F64 => self.backward::<f64>(x, kernel, grad),
            other => candle_core::bail!("rankwise-conv2d: unsupported dtype {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Brute-force value and gradients of `Σ r ⊙ conv(x, w)` (NCHW, f64, row-major vectors).
    #[allow(clippy::type_complexity)]
    fn reference(
        x: &[f64],
        w: &[f64],
        r: &[f64],
        (b, ci, hw): (usize, usize, usize),
        (co, k): (usize, usize),
        (s, p): (usize, usize),
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let ho = (hw + 2 * p - k) / s + 1;
        let mut y = vec![0.0; b * co * ho * ho];
        let mut gx = vec![0.0; x.len()];
        let mut gw = vec![0.0; w.len()];
        for n in 0..b {
            for o in 0..co {
                for oy in 0..ho {
                    for ox in 0..ho {
                        let yi = ((n * co + o) * ho + oy) * ho + ox;
                        for c in 0..ci {
                            for ky in 0..k {
                                for kx in 0..k {
                                    let (iy, ix) = (
                                        (oy * s + ky) as i64 - p as i64,
                                        (ox * s + kx) as i64 - p as i64,
                                    );
                                    if iy < 0 || ix < 0 || iy >= hw as i64 || ix >= hw as i64 {
                                        continue;
                                    }
                                    let xi = ((n * ci + c) * hw + iy as usize) * hw + ix as usize;
                                    let wi = ((o * ci + c) * k + ky) * k + kx;
                                    y[yi] += x[xi] * w[wi];
                                    gx[xi] += r[yi] * w[wi];
                                    gw[wi] += r[yi] * x[xi];
                                }
                            }
                        }
                    }
                }
            }
        }
        (y, gx, gw)
    }

    fn flat(t: &Tensor) -> Vec<f64> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn assert_close(a: &[f64], b: &[f64], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        let diff = a
            .iter()
            .zip(b)
            .map(|(u, v)| (u - v).abs())
            .fold(0.0, f64::max);
        assert!(diff < 1e-10, "{what}: max difference {diff}");
    }

    #[test]
    fn value_and_gradients_match_a_brute_force_convolution() {
        let d = Device::Cpu;
        // (c_in, c_out, size, kernel, stride, padding): the layers of ResNet and the small CNN,
        // with sizes where the stride divides evenly and where the last row is left out.
        for &(ci, co, hw, k, s, p) in &[
            (3, 4, 9, 7, 2, 3),
            (3, 4, 8, 7, 2, 3),
            (2, 3, 6, 3, 1, 1),
            (2, 3, 7, 3, 2, 1),
            (2, 3, 8, 3, 2, 1),
            (3, 2, 5, 1, 1, 0),
            (3, 2, 7, 1, 2, 0),
            (2, 2, 6, 3, 1, 0),
            // Width-keeping stride-1 taps copied as one block (`same_width_block`): a padding
            // of 2, a 1 × 1 input whose outer taps read only padding, an odd size.
            (2, 3, 5, 5, 1, 2),
            (1, 2, 1, 3, 1, 1),
            (2, 2, 3, 3, 1, 1),
        ] {
            let what = format!("c{ci}→{co} {hw}×{hw} k{k} s{s} p{p}");
            let x = Var::randn(0f64, 1.0, (2, ci, hw, hw), &d).unwrap();
            let w = Var::randn(0f64, 1.0, (co, ci, k, k), &d).unwrap();
            // One group of images, one image per group, and the path of the other devices
            // (max_cols = 0 below).
            for max_cols in [MAX_COLS_ELEMENTS, 1, 0] {
                let y = if max_cols == 0 {
                    conv2d_device(x.as_tensor(), w.as_tensor(), s, p).unwrap()
                } else {
                    conv2d_grouped(x.as_tensor(), w.as_tensor(), s, p, max_cols).unwrap()
                };
                let r = Tensor::randn(0f64, 1.0, y.dims(), &d).unwrap();
                let (ry, rgx, rgw) = reference(
                    &flat(x.as_tensor()),
                    &flat(w.as_tensor()),
                    &flat(&r),
                    (2, ci, hw),
                    (co, k),
                    (s, p),
                );
                assert_close(&flat(&y), &ry, &format!("{what} value"));
                if max_cols > 0 {
                    // Inputs that need no gradient: the op's value without a backward pass.
                    let (xd, wd) = (x.as_tensor().detach(), w.as_tensor().detach());
                    let untracked = conv2d_grouped(&xd, &wd, s, p, max_cols).unwrap();
                    assert_eq!(flat(&untracked), flat(&y), "{what} untracked value");
                }
                let g = (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
                assert_close(
                    &flat(g.get(x.as_tensor()).unwrap()),
                    &rgx,
                    &format!("{what} ∂x"),
                );
                assert_close(
                    &flat(g.get(w.as_tensor()).unwrap()),
                    &rgw,
                    &format!("{what} ∂w"),
                );
            }
        }
    }

    #[test]
    fn batches_larger_than_the_parts_match_the_device_path_and_the_thread_count_does_not_matter() {
        let d = Device::Cpu;
        // 37 images: 16 uneven parts of 2–3 images; stride 2 and a 1×1 kernel too.
        for &(ci, co, hw, k, s, p) in &[(3, 5, 6, 3, 1, 1), (4, 3, 7, 3, 2, 1), (5, 2, 4, 1, 1, 0)]
        {
            let x = Var::randn(0f64, 1.0, (37, ci, hw, hw), &d).unwrap();
            let w = Var::randn(0f64, 1.0, (co, ci, k, k), &d).unwrap();
            let grads = |threads: usize, device_path: bool| -> Vec<Vec<f64>> {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    let y = if device_path {
                        conv2d_device(x.as_tensor(), w.as_tensor(), s, p).unwrap()
                    } else {
                        conv2d(x.as_tensor(), w.as_tensor(), s, p).unwrap()
                    };
                    let r = Tensor::arange(0f64, y.elem_count() as f64, &d)
                        .unwrap()
                        .reshape(y.dims())
                        .unwrap()
                        .cos()
                        .unwrap();
                    let g = (&y * r).unwrap().sum_all().unwrap().backward().unwrap();
                    vec![
                        flat(&y),
                        flat(g.get(x.as_tensor()).unwrap()),
                        flat(g.get(w.as_tensor()).unwrap()),
                    ]
                })
            };
            let one = grads(1, false);
            assert_eq!(one, grads(3, false), "bits depend on the thread count");
            for (a, b) in one.iter().zip(&grads(2, true)) {
                assert_close(a, b, &format!("c{ci}→{co} {hw}² k{k} s{s} p{p}"));
            }
        }
    }

    #[test]
    fn the_device_path_skips_the_input_gradient_of_plain_images_too() {
        let d = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (2, 3, 9, 9), &d).unwrap();
        let w = Var::randn(0f32, 1.0, (4, 3, 7, 7), &d).unwrap();
        let y = conv2d_device(&x, w.as_tensor(), 2, 3).unwrap();
        let g = y.sum_all().unwrap().backward().unwrap();
        assert!(g.get(&x).is_none());
        let reference = conv2d(&x, w.as_tensor(), 2, 3).unwrap();
        let g_ref = reference.sum_all().unwrap().backward().unwrap();
        let diff = (g.get(w.as_tensor()).unwrap() - g_ref.get(w.as_tensor()).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-3, "∂w differs by {diff}");
    }

    #[test]
    fn no_input_gradient_for_plain_images() {
        let d = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (1, 2, 5, 5), &d).unwrap();
        let w = Var::randn(0f32, 1.0, (3, 2, 3, 3), &d).unwrap();
        let g = conv2d(&x, w.as_tensor(), 1, 1)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(g.get(&x).is_none());
        assert_eq!(g.get(w.as_tensor()).unwrap().dtype(), DType::F32);
    }
}

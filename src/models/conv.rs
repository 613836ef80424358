//! 2-D convolution with a fast backward pass on the CPU.
//!
//! candle 0.11 back-propagates a convolution to its input with `conv_transpose2d`, whose CPU
//! kernel is a direct loop 5–10× slower than the forward convolution (measured on 3 × 3 layers
//! of the small CNN), and computes that input gradient even for the images, which need none.
//! Here the convolution is a custom op: the forward value is candle's `conv2d`, the input
//! gradient is the forward convolution of the (stride-dilated) output gradient with the
//! flipped, transposed kernel (the textbook identity, using candle's fast im2col + GEMM path) and
//! is skipped when the input does not require a gradient, and the kernel gradient is candle's
//! own formula. Values and gradients equal candle's up to floating-point summation order
//! (tested in `f64`).

use crate::error::{Error, Result};
use candle_core::{CpuStorage, CustomOp2, Device, Layout, Shape, Storage, Tensor};

/// `x` (`B × C_in × H × W`) convolved with `kernel` (`C_out × C_in × K × K`), symmetric zero
/// `padding`, `stride`, no dilation, one group. On the CPU the backward pass is the fast one of
/// the module documentation; on other devices candle's own.
pub fn conv2d(x: &Tensor, kernel: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let (_, _, kh, kw) = kernel.dims4()?;
    if kh != kw || kh == 0 || padding > kh - 1 {
        return Err(Error::Shape(format!(
            "convolution needs a square kernel and padding < kernel, got {kh}×{kw} with padding \
             {padding}"
        )));
    }
    if !matches!(x.device(), Device::Cpu) || !(x.track_op() || kernel.track_op()) {
        return Ok(x.conv2d(kernel, padding, stride, 1, 1)?);
    }
    let value = x.detach().conv2d(&kernel.detach(), padding, stride, 1, 1)?;
    Ok(x.apply_op2(
        kernel,
        ConvOp {
            stride,
            padding,
            value,
        },
    )?)
}

/// The custom op: carries the forward value computed by candle.
struct ConvOp {
    stride: usize,
    padding: usize,
    value: Tensor,
}

impl CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "rankwise-conv2d"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (storage, layout) = self.value.storage_and_layout();
        match &*storage {
            Storage::Cpu(s) if layout.is_contiguous() && layout.start_offset() == 0 => {
                Ok((s.clone(), layout.shape().clone()))
            }
            _ => candle_core::bail!(
                "rankwise-conv2d: the forward value must be a contiguous CPU tensor"
            ),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let grad_x = if x.track_op() {
            Some(input_grad(x, kernel, &grad, self.stride, self.padding)?)
        } else {
            None
        };
        let grad_k = if kernel.track_op() {
            // candle's kernel gradient (backprop.rs, Op::Conv2D).
            let (_, _, kh, kw) = kernel.dims4()?;
            let gk = x
                .transpose(0, 1)?
                .conv2d(&grad.transpose(0, 1)?, self.padding, 1, self.stride, 1)?
                .transpose(0, 1)?;
            let (_, _, gh, gw) = gk.dims4()?;
            Some(if gh != kh || gw != kw {
                gk.narrow(2, 0, kh)?.narrow(3, 0, kw)?
            } else {
                gk
            })
        } else {
            None
        };
        Ok((grad_x, grad_k))
    }
}

/// `∂L/∂x` of a convolution: the output gradient, dilated by the stride (zeros between
/// rows/columns), convolved with the kernel flipped in space and with its channel axes swapped,
/// with padding `K − 1 − p`. When the stride does not divide `H + 2p − K`, the last input rows
/// are still read by the last windows but have no dilated-gradient row after them: zero rows are
/// appended to the dilated gradient (PyTorch's `output_padding`).
fn input_grad(
    x: &Tensor,
    kernel: &Tensor,
    grad: &Tensor,
    stride: usize,
    padding: usize,
) -> candle_core::Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    let (_, _, k, _) = kernel.dims4()?;
    let (_, _, ho, wo) = grad.dims4()?;
    let g = if stride > 1 {
        dilate(grad, stride)?
    } else {
        grad.clone()
    };
    // Output side of the plain transposed convolution: (o − 1)s + K − 2p.
    let extra_h = h - ((ho - 1) * stride + k - 2 * padding);
    let extra_w = w - ((wo - 1) * stride + k - 2 * padding);
    let g = if extra_h > 0 {
        g.pad_with_zeros(2, 0, extra_h)?
    } else {
        g
    };
    let g = if extra_w > 0 {
        g.pad_with_zeros(3, 0, extra_w)?
    } else {
        g
    };
    let flipped = kernel.flip(&[2, 3])?.transpose(0, 1)?.contiguous()?;
    g.conv2d(&flipped, k - 1 - padding, 1, 1, 1)
}

/// Inserts `s − 1` zeros between consecutive rows and columns: `(H − 1)s + 1 × (W − 1)s + 1`.
fn dilate(g: &Tensor, s: usize) -> candle_core::Result<Tensor> {
    let (b, c, h, w) = g.dims4()?;
    let zeros = g.zeros_like()?;
    // Rows: interleave each row with s − 1 zero rows.
    let mut parts = vec![g.unsqueeze(3)?];
    parts.extend(std::iter::repeat_n(zeros.unsqueeze(3)?, s - 1));
    let rows = Tensor::cat(&parts, 3)?
        .reshape((b, c, h * s, w))?
        .narrow(2, 0, (h - 1) * s + 1)?;
    let hr = (h - 1) * s + 1;
    let zeros = rows.zeros_like()?;
    let mut parts = vec![rows.unsqueeze(4)?];
    parts.extend(std::iter::repeat_n(zeros.unsqueeze(4)?, s - 1));
    Tensor::cat(&parts, 4)?
        .reshape((b, c, hr, w * s))?
        .narrow(3, 0, (w - 1) * s + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Var};

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
        ] {
            let what = format!("c{ci}→{co} {hw}×{hw} k{k} s{s} p{p}");
            let x = Var::randn(0f64, 1.0, (2, ci, hw, hw), &d).unwrap();
            let w = Var::randn(0f64, 1.0, (co, ci, k, k), &d).unwrap();
            let y = conv2d(x.as_tensor(), w.as_tensor(), s, p).unwrap();
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

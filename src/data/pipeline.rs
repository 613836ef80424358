//! The image pipeline: decode, resize, crop, flip, normalise, and batch into a `B × 3 × H × W`
//! `f32` tensor, with multi-threaded prefetching.
//!
//! **Semantics are torchvision's on PIL images**, the setting of all five papers' code:
//!
//! * [`resize_bilinear`] is Pillow's `Image.resize(…, BILINEAR)` (`libImaging/Resample.c`): a
//!   separable triangle filter whose support grows with the downscaling factor (antialiasing),
//!   8-bit fixed-point coefficients (22 fractional bits), horizontal pass first with an 8-bit
//!   intermediate image. It reproduces Pillow's output byte for byte (tested against Pillow
//!   output in `tests/integration/pipeline.rs`).
//! * [`Op::Resize`] with [`Resize::ShorterSide`] is `transforms.Resize(int)`: the shorter side
//!   becomes `s`, the longer `int(s · long / short)` (truncated).
//! * [`Op::CenterCrop`] is `transforms.CenterCrop`: top-left corner
//!   `(round((h − th) / 2), round((w − tw) / 2))` with Python's round-half-to-even; a crop larger
//!   than the image is filled with zeros, as PIL's `crop` does (torchvision ≤ 0.9, which the
//!   papers used).
//! * [`Op::RandomResizedCrop`] is `transforms.RandomResizedCrop` ([`random_resized_crop_box`]):
//!   up to 10 attempts to draw an area fraction in `scale` and a log-uniform aspect ratio in
//!   `ratio`, `w = round(√(A·r))`, `h = round(√(A/r))` (half-to-even), accepted if it fits, at a
//!   uniform position; after 10 failures, a central crop of the whole image clamped to the ratio
//!   range. The box is then resized to the output size.
//! * [`Op::RandomCrop`] is `transforms.RandomCrop(size, padding)` (zero padding), and
//!   [`Op::HorizontalFlip`] `transforms.RandomHorizontalFlip(p)`.
//! * [`to_chw`] is `ToTensor` then `Normalize`: `(v / 255 − mean) / std` in `f32`.
//!
//! Decoding uses the `image` crate and converts to 8-bit RGB like PIL's `convert('RGB')` (grey is
//! replicated, alpha dropped). PNG decoding is lossless, so identical to PIL. JPEG is not
//! bit-identical: the `image` crate decodes with zune-jpeg, whose integer IDCT and chroma
//! up-sampling round differently from libjpeg-turbo's (Pillow's decoder). Measured on the q90,
//! 4:2:0 fixture of `tests/integration/pipeline.rs`: max |Δ| = 3, 28 % of the values differ, mean |Δ| 0.39 (on
//! a 0–255 scale); a grey JPEG of the same image: max |Δ| = 1 on 1.6 % of the values. Everything
//! after decoding is exact.
//!
//! **Randomness.** The random draws cannot match torch's generator; their distributions are
//! torchvision's. Each sample's augmentation uses its own ChaCha8 stream derived from
//! `(seed, epoch, dataset index)` ([`sample_rng`]), so a batch's content does not depend on the
//! number of threads or on scheduling, and any epoch can be replayed.

use crate::data::staging::Staging;
use crate::error::{Error, Result};
use candle_core::{Device, Tensor};
use image::RgbImage;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// ImageNet channel means (torchvision's `Normalize` for ImageNet-pretrained backbones).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet channel standard deviations.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// `x / 255` computed in `f64` and rounded to `f32`, as SSR's `[x / 255.0 for x in …]` lists
/// become a float32 tensor.
const fn div255(x: f64) -> f32 {
    (x / 255.0) as f32
}

/// How [`Op::Resize`] sizes the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    /// `Resize(s)`: the shorter side becomes `s`, the aspect ratio is kept.
    ShorterSide(u32),
    /// `Resize((h, w))`: exactly `h × w`.
    Exact {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
}

/// One geometric step of a [`Transform`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// Bilinear resize (module doc).
    Resize(Resize),
    /// Central crop (zero-filled where larger than the image).
    CenterCrop {
        /// Crop height.
        height: u32,
        /// Crop width.
        width: u32,
    },
    /// Random area-and-aspect crop resized to `height × width` ([`random_resized_crop_box`]).
    RandomResizedCrop {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
        /// Range of the crop area as a fraction of the image area.
        scale: (f64, f64),
        /// Range of the crop aspect ratio `w / h`.
        ratio: (f64, f64),
    },
    /// Zero-pad by `padding` on every side, then crop `height × width` at a uniform position.
    /// (When the padded image is still smaller than the crop, torchvision raises an error; here
    /// the crop starts at the corner and the missing part is zero.)
    RandomCrop {
        /// Crop height.
        height: u32,
        /// Crop width.
        width: u32,
        /// Padding added on each side first.
        padding: u32,
    },
    /// Mirror left-right with probability `p`.
    HorizontalFlip {
        /// Flip probability.
        p: f64,
    },
}

/// Per-channel normalisation `(v / 255 − mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Channel means (R, G, B), in `[0, 1]` units.
    pub mean: [f32; 3],
    /// Channel standard deviations.
    pub std: [f32; 3],
}

impl Normalize {
    /// ImageNet statistics, used by every retrieval paper here.
    pub const IMAGENET: Normalize = Normalize {
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
    };
    /// SSR's mini-ImageNet statistics (`transductive_few_shot/src/dataset.py`).
    pub const MINI_IMAGENET: Normalize = Normalize {
        mean: [
            div255(120.39586422),
            div255(115.59361427),
            div255(104.54012653),
        ],
        std: [
            div255(70.68188272),
            div255(68.27635443),
            div255(72.54505529),
        ],
    };
    /// SSR's tiered-ImageNet statistics.
    pub const TIERED_IMAGENET: Normalize = Normalize {
        mean: [div255(125.3), div255(123.0), div255(113.9)],
        std: [div255(63.0), div255(62.1), div255(66.7)],
    };
    /// SSR's CIFAR-FS statistics.
    pub const CIFAR_FS: Normalize = Normalize {
        mean: [
            div255(129.37731888),
            div255(124.10583864),
            div255(112.47758569),
        ],
        std: [
            div255(68.20947949),
            div255(65.43124043),
            div255(70.45866994),
        ],
    };
    /// No normalisation: values `v / 255` in `[0, 1]` (`ToTensor` only).
    pub const NONE: Normalize = Normalize {
        mean: [0.0; 3],
        std: [1.0; 3],
    };
}

/// A sequence of geometric [`Op`]s followed by normalisation: one paper's train or test
/// preprocessing.
#[derive(Debug, Clone, PartialEq)]
pub struct Transform {
    /// Steps, applied in order.
    pub ops: Vec<Op>,
    /// Final normalisation.
    pub normalize: Normalize,
}

/// The torchvision `RandomResizedCrop` defaults.
pub const DEFAULT_SCALE: (f64, f64) = (0.08, 1.0);
/// The torchvision `RandomResizedCrop` default ratio range `(3/4, 4/3)`.
pub const DEFAULT_RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);
/// The ranges of HAPPIER's configs (`scale: [0.16, 1]`, `ratio: [0.75, 1.33]`).
const HAPPIER_SCALE: (f64, f64) = (0.16, 1.0);
const HAPPIER_RATIO: (f64, f64) = (0.75, 1.33);

fn rrc(size: u32, scale: (f64, f64), ratio: (f64, f64)) -> Op {
    Op::RandomResizedCrop {
        height: size,
        width: size,
        scale,
        ratio,
    }
}

fn center(size: u32) -> Op {
    Op::CenterCrop {
        height: size,
        width: size,
    }
}

const FLIP: Op = Op::HorizontalFlip { p: 0.5 };

impl Transform {
    /// Smooth-AP training (code, `datasets.py`): `RandomResizedCrop(224)` with the default
    /// scale (0.08, 1) and ratio (3/4, 4/3), then `RandomHorizontalFlip(0.5)`; ImageNet
    /// normalisation. The paper's text says the images are first resized to 256; the code does
    /// not.
    pub fn retrieval_train() -> Self {
        Transform {
            ops: vec![rrc(224, DEFAULT_SCALE, DEFAULT_RATIO), FLIP],
            normalize: Normalize::IMAGENET,
        }
    }

    /// Smooth-AP and HAPPIER (iNat, DyML) test: `Resize(256)` then `CenterCrop(224)`.
    pub fn retrieval_test() -> Self {
        Transform {
            ops: vec![Op::Resize(Resize::ShorterSide(256)), center(224)],
            normalize: Normalize::IMAGENET,
        }
    }

    /// HAPPIER on SOP (`config/transform/sop.yaml`): `Resize(256)`, then
    /// `RandomResizedCrop(224, scale=(0.16, 1), ratio=(0.75, 1.33))`, then the flip.
    pub fn happier_sop_train() -> Self {
        Transform {
            ops: vec![
                Op::Resize(Resize::ShorterSide(256)),
                rrc(224, HAPPIER_SCALE, HAPPIER_RATIO),
                FLIP,
            ],
            normalize: Normalize::IMAGENET,
        }
    }

    /// HAPPIER on SOP, test: `Resize((256, 256))` then `CenterCrop(224)`.
    pub fn happier_sop_test() -> Self {
        Transform {
            ops: vec![
                Op::Resize(Resize::Exact {
                    height: 256,
                    width: 256,
                }),
                center(224),
            ],
            normalize: Normalize::IMAGENET,
        }
    }

    /// HAPPIER on iNaturalist and DyML (`config/transform/inat.yaml`):
    /// `RandomResizedCrop(224, scale=(0.16, 1), ratio=(0.75, 1.33))` and the flip, no resize
    /// first. The test transform is [`Transform::retrieval_test`].
    pub fn happier_inat_train() -> Self {
        Transform {
            ops: vec![rrc(224, HAPPIER_SCALE, HAPPIER_RATIO), FLIP],
            normalize: Normalize::IMAGENET,
        }
    }

    /// SSR mini-ImageNet evaluation: `CenterCrop(80)` (the code feeds 80 × 80 crops of the
    /// 84 × 84 images) with SSR's mini-ImageNet statistics. SSR's training transform adds
    /// `ColorJitter`, which is not implemented here: SSR trains on frozen, pre-extracted features.
    pub fn ssr_mini_imagenet_test() -> Self {
        Transform {
            ops: vec![center(80)],
            normalize: Normalize::MINI_IMAGENET,
        }
    }

    /// SSR tiered-ImageNet training: `RandomResizedCrop(84)` (default ranges) and the flip.
    pub fn ssr_tiered_imagenet_train() -> Self {
        Transform {
            ops: vec![rrc(84, DEFAULT_SCALE, DEFAULT_RATIO), FLIP],
            normalize: Normalize::TIERED_IMAGENET,
        }
    }

    /// SSR tiered-ImageNet evaluation: `Resize((92, 92))` then `CenterCrop(84)`.
    pub fn ssr_tiered_imagenet_test() -> Self {
        Transform {
            ops: vec![
                Op::Resize(Resize::Exact {
                    height: 92,
                    width: 92,
                }),
                center(84),
            ],
            normalize: Normalize::TIERED_IMAGENET,
        }
    }

    /// SSR CIFAR-FS evaluation: no geometric step (32 × 32 images), CIFAR-FS statistics.
    pub fn ssr_cifar_fs_test() -> Self {
        Transform {
            ops: Vec::new(),
            normalize: Normalize::CIFAR_FS,
        }
    }

    /// Checks every parameter: sizes positive, ranges ordered and positive, probabilities in
    /// `[0, 1]`. Errors name the step.
    pub fn validate(&self) -> Result<()> {
        for (k, op) in self.ops.iter().enumerate() {
            let field = format!("transform step {k}");
            let bad = |msg: &str| Err(Error::invalid(&field, format!("{op:?}: {msg}")));
            match *op {
                Op::Resize(Resize::ShorterSide(0)) => return bad("size must be > 0"),
                Op::Resize(Resize::Exact { height, width }) if height == 0 || width == 0 => {
                    return bad("size must be > 0")
                }
                Op::CenterCrop { height, width } | Op::RandomCrop { height, width, .. }
                    if height == 0 || width == 0 =>
                {
                    return bad("size must be > 0")
                }
                Op::RandomResizedCrop {
                    height,
                    width,
                    scale,
                    ratio,
                } => {
                    if height == 0 || width == 0 {
                        return bad("size must be > 0");
                    }
                    if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1.is_finite()) {
                        return bad("scale must satisfy 0 < min ≤ max");
                    }
                    if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
                        return bad("ratio must satisfy 0 < min ≤ max");
                    }
                }
                Op::HorizontalFlip { p } if !(0.0..=1.0).contains(&p) => {
                    return bad("p must be in [0, 1]")
                }
                _ => {}
            }
        }
        for (c, s) in self.normalize.std.iter().enumerate() {
            if !(s.is_finite() && *s > 0.0 && self.normalize.mean[c].is_finite()) {
                return Err(Error::invalid(
                    "normalize",
                    format!("channel {c}: std must be finite and > 0, mean finite"),
                ));
            }
        }
        Ok(())
    }

    /// Applies the geometric steps; `rng` drives the random ones.
    pub fn apply<R: Rng>(&self, mut img: RgbImage, rng: &mut R) -> RgbImage {
        for op in &self.ops {
            img = apply_op(op, img, rng);
        }
        img
    }
}

/// Applies one step.
fn apply_op<R: Rng>(op: &Op, img: RgbImage, rng: &mut R) -> RgbImage {
    let (w, h) = img.dimensions();
    match *op {
        Op::Resize(Resize::ShorterSide(s)) => {
            let (nw, nh) = shorter_side_size(w, h, s);
            resize_bilinear(&img, nw, nh)
        }
        Op::Resize(Resize::Exact { height, width }) => resize_bilinear(&img, width, height),
        Op::CenterCrop { height, width } => {
            let (top, left) = center_crop_origin(h, w, height, width);
            crop(&img, left, top, width, height)
        }
        Op::RandomResizedCrop {
            height,
            width,
            scale,
            ratio,
        } => {
            let b = random_resized_crop_box(h, w, scale, ratio, rng);
            let c = crop(&img, b.left as i64, b.top as i64, b.width, b.height);
            resize_bilinear(&c, width, height)
        }
        Op::RandomCrop {
            height,
            width,
            padding,
        } => {
            // Padding then cropping equals cropping the unpadded image at a shifted origin with
            // zero fill outside it.
            let (ph, pw) = (h as i64 + 2 * padding as i64, w as i64 + 2 * padding as i64);
            let top = rng.random_range(0..=(ph - height as i64).max(0));
            let left = rng.random_range(0..=(pw - width as i64).max(0));
            crop(
                &img,
                left - padding as i64,
                top - padding as i64,
                width,
                height,
            )
        }
        Op::HorizontalFlip { p } => {
            if rng.random::<f64>() < p {
                image::imageops::flip_horizontal(&img)
            } else {
                img
            }
        }
    }
}

/// torchvision `Resize(s)`: `(width, height)` with the shorter side `s` and the longer side
/// `int(s · long / short)`; unchanged if the shorter side is already `s`.
pub fn shorter_side_size(width: u32, height: u32, s: u32) -> (u32, u32) {
    if width <= height {
        if width == s {
            return (width, height);
        }
        (s, (s as u64 * height as u64 / width.max(1) as u64) as u32)
    } else {
        if height == s {
            return (width, height);
        }
        ((s as u64 * width as u64 / height.max(1) as u64) as u32, s)
    }
}

/// torchvision `CenterCrop`'s `(top, left)`: `round((h − th) / 2)`, `round((w − tw) / 2)` with
/// Python's round-half-to-even (negative when the crop is larger than the image).
pub fn center_crop_origin(height: u32, width: u32, crop_h: u32, crop_w: u32) -> (i64, i64) {
    let top = ((height as f64 - crop_h as f64) / 2.0).round_ties_even() as i64;
    let left = ((width as f64 - crop_w as f64) / 2.0).round_ties_even() as i64;
    (top, left)
}

/// A crop box in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    /// First row.
    pub top: u32,
    /// First column.
    pub left: u32,
    /// Number of rows.
    pub height: u32,
    /// Number of columns.
    pub width: u32,
}

/// torchvision `RandomResizedCrop.get_params` for an image of `height × width`: always inside
/// the image (module doc).
pub fn random_resized_crop_box<R: Rng>(
    height: u32,
    width: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut R,
) -> CropBox {
    let area = height as f64 * width as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * uniform(rng, scale.0, scale.1);
        let aspect = uniform(rng, log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if w > 0.0 && w <= width as f64 && h > 0.0 && h <= height as f64 {
            let (w, h) = (w as u32, h as u32);
            // torch.randint(0, n + 1): uniform on 0..=n.
            let top = rng.random_range(0..=height - h);
            let left = rng.random_range(0..=width - w);
            return CropBox {
                top,
                left,
                height: h,
                width: w,
            };
        }
    }
    // Fallback: a central crop of the whole image, clamped to the ratio range.
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0 {
        (width, (width as f64 / ratio.0).round_ties_even() as u32)
    } else if in_ratio > ratio.1 {
        ((height as f64 * ratio.1).round_ties_even() as u32, height)
    } else {
        (width, height)
    };
    CropBox {
        top: (height - h) / 2,
        left: (width - w) / 2,
        height: h,
        width: w,
    }
}

/// Uniform on `[lo, hi)` (`lo` when the range is empty), as `torch.empty(1).uniform_(lo, hi)`.
fn uniform<R: Rng>(rng: &mut R, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

/// PIL `Image.crop((left, top, left + width, top + height))`: pixels outside the image are zero.
pub fn crop(img: &RgbImage, left: i64, top: i64, width: u32, height: u32) -> RgbImage {
    let (iw, ih) = (img.width() as i64, img.height() as i64);
    let mut out = RgbImage::new(width, height);
    let src = img.as_raw();
    let dst: &mut [u8] = &mut out;
    // Column range of the source that lands inside the output.
    let x0 = left.max(0);
    let x1 = (left + width as i64).min(iw);
    if x0 >= x1 {
        return out;
    }
    for y in 0..height as i64 {
        let sy = top + y;
        if sy < 0 || sy >= ih {
            continue;
        }
        let s = ((sy * iw + x0) * 3) as usize;
        let d = ((y * width as i64 + (x0 - left)) * 3) as usize;
        let n = ((x1 - x0) * 3) as usize;
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    out
}

/// Fractional bits of Pillow's 8-bit resampling coefficients (`PRECISION_BITS = 32 − 8 − 2`).
const PRECISION_BITS: u32 = 22;

/// Pillow's `precompute_coeffs` for the bilinear (triangle) filter: for each output pixel, the
/// first input pixel and the fixed-point weights of the input pixels it averages.
fn resample_coeffs(in_size: u32, out_size: u32) -> (Vec<(usize, usize)>, Vec<i32>, usize) {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filterscale; // the triangle filter has support 1
    let ksize = support.ceil() as usize * 2 + 1;
    let mut bounds = Vec::with_capacity(out_size as usize);
    let mut kk = vec![0i32; out_size as usize * ksize];
    let mut weights = vec![0f64; ksize];
    for xx in 0..out_size as usize {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's (int) truncates toward zero.
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) - xmin;
        let (xmin, xmax) = (xmin as usize, xmax.max(0) as usize);
        let mut ww = 0.0;
        for (x, w) in weights.iter_mut().enumerate().take(xmax) {
            let t = ((x + xmin) as f64 - center + 0.5) * ss;
            *w = (1.0 - t.abs()).max(0.0);
            ww += *w;
        }
        for (x, w) in weights.iter().enumerate().take(xmax) {
            let v = if ww != 0.0 { w / ww } else { *w };
            // normalize_coeffs_8bpc: round half away from zero.
            kk[xx * ksize + x] = if v < 0.0 {
                (-0.5 + v * (1 << PRECISION_BITS) as f64) as i32
            } else {
                (0.5 + v * (1 << PRECISION_BITS) as f64) as i32
            };
        }
        bounds.push((xmin, xmax));
    }
    (bounds, kk, ksize)
}

/// Pillow's `clip8`: the fixed-point sum shifted back to 8 bits and clamped.
#[inline]
fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Pillow's bilinear `Image.resize((width, height))` of an RGB image (module doc): byte-exact.
pub fn resize_bilinear(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    let (iw, ih) = img.dimensions();
    if (iw, ih) == (width, height) || width == 0 || height == 0 || iw == 0 || ih == 0 {
        return if (iw, ih) == (width, height) {
            img.clone()
        } else {
            RgbImage::new(width, height)
        };
    }
    let half = 1i32 << (PRECISION_BITS - 1);
    // Horizontal pass into an 8-bit intermediate image, as Pillow.
    let horizontal = if iw != width {
        let (bounds, kk, ksize) = resample_coeffs(iw, width);
        let src = img.as_raw();
        let mut out = vec![0u8; width as usize * ih as usize * 3];
        for y in 0..ih as usize {
            let row = &src[y * iw as usize * 3..(y + 1) * iw as usize * 3];
            for (xx, &(xmin, xmax)) in bounds.iter().enumerate() {
                let k = &kk[xx * ksize..xx * ksize + xmax];
                let mut ss = [half; 3];
                let pixels = row[xmin * 3..(xmin + xmax) * 3].chunks_exact(3);
                for (p, &kx) in pixels.zip(k) {
                    ss[0] += p[0] as i32 * kx;
                    ss[1] += p[1] as i32 * kx;
                    ss[2] += p[2] as i32 * kx;
                }
                let o = (y * width as usize + xx) * 3;
                for c in 0..3 {
                    out[o + c] = clip8(ss[c]);
                }
            }
        }
        RgbImage::from_raw(width, ih, out).expect("sized buffer")
    } else {
        img.clone()
    };
    if ih == height {
        return horizontal;
    }
    let (bounds, kk, ksize) = resample_coeffs(ih, height);
    let src = horizontal.as_raw();
    let stride = width as usize * 3;
    let mut out = vec![0u8; stride * height as usize];
    // Whole rows at a time (contiguous, vectorisable); the sums are added in the same order as
    // Pillow's, so the result is identical.
    let mut acc = vec![0i32; stride];
    for (yy, &(ymin, ymax)) in bounds.iter().enumerate() {
        acc.fill(half);
        for (y, &ky) in kk[yy * ksize..yy * ksize + ymax].iter().enumerate() {
            let row = &src[(y + ymin) * stride..(y + ymin + 1) * stride];
            for (a, &p) in acc.iter_mut().zip(row) {
                *a += p as i32 * ky;
            }
        }
        for (o, &a) in out[yy * stride..(yy + 1) * stride].iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    RgbImage::from_raw(width, height, out).expect("sized buffer")
}

/// `ToTensor` + `Normalize`: the image as `3 × H × W` values `(v / 255 − mean) / std` (f32).
pub fn to_chw(img: &RgbImage, normalize: &Normalize) -> Vec<f32> {
    let (w, h) = img.dimensions();
    let plane = (w * h) as usize;
    let mut out = vec![0f32; 3 * plane];
    for (i, p) in img.as_raw().chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * plane + i] = (p[c] as f32 / 255.0 - normalize.mean[c]) / normalize.std[c];
        }
    }
    out
}

/// Decodes an image file to 8-bit RGB; errors name the file.
pub fn decode_image(path: impl AsRef<Path>) -> Result<RgbImage> {
    let path = path.as_ref();
    let reader = image::ImageReader::open(path)
        .map_err(|e| Error::io(path, e))?
        .with_guessed_format()
        .map_err(|e| Error::io(path, e))?;
    let img = reader
        .decode()
        .map_err(|e| Error::file(path, format!("cannot decode image: {e}")))?;
    Ok(img.to_rgb8())
}

/// The random generator of sample `index` in `epoch`: ChaCha8 keyed by `(seed, epoch)`, on
/// stream `index`. Distinct `(seed, epoch, index)` give independent streams.
pub fn sample_rng(seed: u64, epoch: u64, index: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(index);
    rng
}

/// Decodes, transforms and normalises one image: `3 × H × W` values and `(H, W)`.
pub fn load_sample(
    path: &Path,
    transform: &Transform,
    seed: u64,
    epoch: u64,
    index: u64,
) -> Result<(Vec<f32>, (u32, u32))> {
    let img = decode_image(path)?;
    let mut rng = sample_rng(seed, epoch, index);
    let out = transform.apply(img, &mut rng);
    let (w, h) = out.dimensions();
    if w == 0 || h == 0 {
        return Err(Error::file(path, "the transform produced an empty image"));
    }
    Ok((to_chw(&out, &transform.normalize), (h, w)))
}

/// The images `indices` of `paths`, transformed, as a `B × 3 × H × W` tensor on `device`;
/// decoded in parallel on the current rayon pool. Errors name the first file that cannot be
/// decoded, or one whose output size differs from the first image's (a transform that does not
/// end with a fixed-size step).
pub fn load_batch(
    paths: &[PathBuf],
    indices: &[usize],
    transform: &Transform,
    seed: u64,
    epoch: u64,
    device: &Device,
) -> Result<Tensor> {
    let mut staging = Staging::default();
    load_batch_staged(paths, indices, transform, seed, epoch, device, &mut staging)
}

/// [`load_batch`], the batch assembled where `staging` says (a [`BatchLoader`]'s page-locked
/// buffers when bound for a CUDA device).
fn load_batch_staged(
    paths: &[PathBuf],
    indices: &[usize],
    transform: &Transform,
    seed: u64,
    epoch: u64,
    device: &Device,
    staging: &mut Staging,
) -> Result<Tensor> {
    if indices.is_empty() {
        return Err(Error::invalid(
            "indices",
            "a batch needs at least one image",
        ));
    }
    if let Some(&i) = indices.iter().find(|&&i| i >= paths.len()) {
        return Err(Error::invalid(
            "indices",
            format!("{i} out of range for {} images", paths.len()),
        ));
    }
    let samples: Vec<(Vec<f32>, (u32, u32))> = indices
        .par_iter()
        .map(|&i| load_sample(&paths[i], transform, seed, epoch, i as u64))
        .collect::<Result<_>>()?;
    let (h, w) = samples[0].1;
    if let Some(k) = samples.iter().position(|s| s.1 != (h, w)) {
        return Err(Error::file(
            &paths[indices[k]],
            format!(
                "transformed to {} × {} but the batch's first image is {h} × {w}; end the \
                 transform with a fixed-size crop or resize",
                samples[k].1 .0, samples[k].1 .1
            ),
        ));
    }
    staging.tensor(
        samples.iter().map(|(s, _)| &s[..]),
        (indices.len(), 3, h as usize, w as usize),
        device,
    )
}

/// Settings of a [`BatchLoader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Decoding threads (≥ 1).
    pub threads: usize,
    /// Batches prepared ahead of the one being consumed (≥ 1).
    pub prefetch: usize,
    /// Seed of the augmentations.
    pub seed: u64,
}

impl Default for LoaderConfig {
    /// All cores, 2 batches ahead, seed 0 (HAPPIER's seed).
    fn default() -> Self {
        LoaderConfig {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            prefetch: 2,
            seed: 0,
        }
    }
}

/// One loaded mini-batch.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Dataset indices of the images, in batch order.
    pub indices: Vec<usize>,
    /// `B × 3 × H × W` `f32` images.
    pub images: Tensor,
}

/// Loads the batches of one epoch in the background: a dedicated thread pool decodes and
/// augments the next batches while the current one is used, up to `prefetch` batches ahead
/// (a bounded channel). Iterate it to get the batches in order; dropping it stops the work.
///
/// After an error (an undecodable file), the iterator yields that error and ends.
///
/// Batches for a CUDA device are put there by the worker thread, from page-locked buffers
/// ([`crate::data::staging`]): the copy is queued on the device's stream, and the consumer gets
/// a tensor already on the device. On a device whose threads do not share one stream
/// ([`crate::device::shared_stream`]) the worker's copy would not be ordered with the
/// consumer's work: the worker then assembles the batch on the host and the consumer's thread
/// copies it.
pub struct BatchLoader {
    rx: Option<Receiver<Result<Batch>>>,
    worker: Option<JoinHandle<()>>,
    /// Where the consumer's thread puts each batch, when the worker cannot.
    upload_here: Option<Device>,
}

impl BatchLoader {
    /// Starts loading `batches` (lists of indices into `paths`, e.g. a sampler's batches of
    /// `epoch`) with `transform`.
    pub fn new(
        paths: Arc<Vec<PathBuf>>,
        batches: Vec<Vec<usize>>,
        transform: Transform,
        epoch: u64,
        config: LoaderConfig,
        device: Device,
    ) -> Result<Self> {
        transform.validate()?;
        if config.threads == 0 || config.prefetch == 0 {
            return Err(Error::invalid(
                "loader",
                "threads and prefetch must be at least 1",
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads)
            .thread_name(|i| format!("rankwise-loader-{i}"))
            .build()
            .map_err(|e| Error::invalid("threads", e.to_string()))?;
        let (tx, rx) = sync_channel(config.prefetch);
        let (device, upload_here) = if crate::device::shared_stream(&device) {
            (device, None)
        } else {
            (Device::Cpu, Some(device))
        };
        let worker = std::thread::Builder::new()
            .name("rankwise-prefetch".into())
            .spawn(move || {
                let mut staging = match Staging::for_device(&device, config.prefetch) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                for indices in batches {
                    let images = pool.install(|| {
                        load_batch_staged(
                            &paths,
                            &indices,
                            &transform,
                            config.seed,
                            epoch,
                            &device,
                            &mut staging,
                        )
                    });
                    let failed = images.is_err();
                    let item = images.map(|images| Batch { indices, images });
                    // A send error means the consumer dropped the loader: stop.
                    if tx.send(item).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| Error::invalid("loader", format!("cannot start thread: {e}")))?;
        Ok(BatchLoader {
            rx: Some(rx),
            worker: Some(worker),
            upload_here,
        })
    }
}

impl Iterator for BatchLoader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let batch = self.rx.as_ref()?.recv().ok()?;
        Some(match &self.upload_here {
            None => batch,
            Some(device) => batch.and_then(|b| {
                Ok(Batch {
                    images: b.images.to_device(device)?,
                    indices: b.indices,
                })
            }),
        })
    }
}

impl Drop for BatchLoader {
    fn drop(&mut self) {
        // Closing the channel first unblocks a worker waiting to send.
        self.rx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorter_side_truncates_like_torchvision() {
        assert_eq!(shorter_side_size(500, 375, 256), (341, 256));
        assert_eq!(shorter_side_size(375, 500, 256), (256, 341));
        assert_eq!(shorter_side_size(256, 999, 256), (256, 999));
    }

    #[test]
    fn center_crop_rounds_half_to_even() {
        // (257 − 224) / 2 = 16.5 → 16; (259 − 224) / 2 = 17.5 → 18.
        assert_eq!(center_crop_origin(257, 259, 224, 224), (16, 18));
        assert_eq!(center_crop_origin(220, 224, 224, 224), (-2, 0));
    }

    #[test]
    fn coefficients_sum_to_one_in_fixed_point() {
        for (i, o) in [(10u32, 3u32), (3, 10), (640, 224), (7, 7)] {
            let (bounds, kk, ksize) = resample_coeffs(i, o);
            for (xx, &(xmin, n)) in bounds.iter().enumerate() {
                assert!(xmin + n <= i as usize);
                let s: i64 = kk[xx * ksize..xx * ksize + n]
                    .iter()
                    .map(|&k| k as i64)
                    .sum();
                assert!(
                    (s - (1 << PRECISION_BITS)).abs() <= n as i64,
                    "{i}->{o}: {s}"
                );
            }
        }
    }

    #[test]
    fn sample_streams_are_distinct() {
        let a: u64 = sample_rng(1, 2, 3).random();
        assert_eq!(a, sample_rng(1, 2, 3).random::<u64>());
        assert_ne!(a, sample_rng(1, 2, 4).random::<u64>());
        assert_ne!(a, sample_rng(1, 3, 3).random::<u64>());
        assert_ne!(a, sample_rng(2, 2, 3).random::<u64>());
    }
}

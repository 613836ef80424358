//! Host-side `f64` work for the CPU paths of the losses and the batch checks: a tensor's values
//! (borrowed when they already sit in CPU memory, else as an `f64` copy), and reductions with
//! independent partial sums.
//!
//! Why partial sums: a single running sum `s += x` is bound by the latency of the floating-point
//! add (about four cycles per element), because the compiler may not reorder floating-point
//! additions. Eight partial sums break that chain and let it use SIMD registers; on the loss
//! engine's `B × 512` passes that is several times faster. The results differ from a left-to-right
//! sum only by rounding. The sums take `f32` or `f64` slices and accumulate in `f64`, so an `f32`
//! batch is read where it lies instead of being copied to `f64` first.

use crate::error::Result;
use candle_core::{CpuStorage, DType, Storage, Tensor};

const LANES: usize = 8;

/// Runs `f` compiled for the widest SIMD instruction set the CPU has (AVX2 on x86-64 CPUs
/// that have it, detected once at run time; the baseline build otherwise), through `pulp`,
/// the dispatcher candle's `gemm` uses.
///
/// Why: the crate is built for baseline x86-64 (SSE2, two `f64` lanes), so the loss engine's
/// passes over `B × D` rows ran at half the width the CPU offers while the products beside
/// them (gemm) already ran on AVX2. The instructions change, not the arithmetic: Rust never
/// fuses `a * b + c` into an FMA on its own, so results are bit-for-bit those of the baseline
/// build. Functions called from `f` get the wider instructions only where they are inlined
/// (mark the closure and the helpers it calls `#[inline(always)]`; without it the closure was
/// compiled as a separate baseline function and nothing changed).
#[inline(always)]
pub fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// The values of a contiguous CPU tensor, borrowed from its storage.
pub enum HostValues<'a> {
    /// An `f32` tensor's values, row-major.
    F32(&'a [f32]),
    /// An `f64` tensor's values, row-major.
    F64(&'a [f64]),
}

/// Runs `f` on the values of `t` without copying them when `t` is a contiguous `f32` or `f64`
/// tensor in CPU memory; `None` otherwise (another device or dtype, or a strided view: use
/// [`host_f64`]). The storage is read-locked while `f` runs, so `f` must not write to `t`.
pub fn with_host_values<R>(t: &Tensor, f: impl FnOnce(HostValues<'_>) -> R) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    let (start, end) = layout.contiguous_offsets()?;
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => Some(f(HostValues::F32(&v[start..end]))),
        Storage::Cpu(CpuStorage::F64(v)) => Some(f(HostValues::F64(&v[start..end]))),
        _ => None,
    }
}

/// Row-major values of a CPU or device tensor as `f64` (one copy; `f32` and `f64` without a
/// candle cast, which on large tensors would run on candle's own thread pool).
pub fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
    if let Some(v) = with_host_values(t, |v| match v {
        HostValues::F32(s) => vectorised(
            #[inline(always)]
            || s.iter().map(|&x| f64::from(x)).collect(),
        ),
        HostValues::F64(s) => s.to_vec(),
    }) {
        return Ok(v);
    }
    Ok(match t.dtype() {
        DType::F64 => t.flatten_all()?.to_vec1::<f64>()?,
        DType::F32 => t
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect(),
        _ => t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?,
    })
}

/// `Σ f(aᵢ)` in `f64` with [`LANES`] partial sums, added pairwise at the end.
#[inline(always)]
fn lane_sum<T: Copy + Into<f64>>(a: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0f64; LANES];
    let chunks = a.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (s, &x) in acc.iter_mut().zip(c) {
            *s += f(x.into());
        }
    }
    let tail: f64 = rest.iter().map(|&x| f(x.into())).sum();
    reduce(acc) + tail
}

#[inline(always)]
fn reduce(acc: [f64; LANES]) -> f64 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `Σ |aᵢ|` in `f64` (NaN and infinity propagate).
#[inline(always)]
pub fn sum_abs<T: Copy + Into<f64>>(a: &[T]) -> f64 {
    lane_sum(a, f64::abs)
}

/// `Σ aᵢ²` in `f64`.
#[inline(always)]
pub fn sum_squares<T: Copy + Into<f64>>(a: &[T]) -> f64 {
    lane_sum(a, |x| x * x)
}

/// `Σ aᵢ bᵢ` in `f64` over the common length.
#[inline(always)]
pub fn dot<A: Copy + Into<f64>, B: Copy + Into<f64>>(a: &[A], b: &[B]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| x.into() * y.into())
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p.into() * q.into();
        }
    }
    reduce(acc) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectorised_code_gives_the_baseline_bits() {
        // The dispatched build changes the instructions, never the arithmetic (no FMA
        // contraction): every sum and the f32 → f64 copy are bit-for-bit the baseline's.
        let a: Vec<f32> = (0..1037)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let b: Vec<f64> = (0..1037).map(|i| (i as f64).sin() * 1e3).collect();
        let plain = (sum_abs(&a), sum_squares(&b), dot(&a, &b));
        let wide = vectorised(
            #[inline(always)]
            || (sum_abs(&a), sum_squares(&b), dot(&a, &b)),
        );
        assert_eq!(plain.0.to_bits(), wide.0.to_bits());
        assert_eq!(plain.1.to_bits(), wide.1.to_bits());
        assert_eq!(plain.2.to_bits(), wide.2.to_bits());
        let t = Tensor::from_vec(a.clone(), a.len(), &candle_core::Device::Cpu).unwrap();
        let copied = host_f64(&t).unwrap();
        assert!(copied.iter().zip(&a).all(|(&c, &x)| c == f64::from(x)));
    }

    #[test]
    fn sums_match_the_plain_loops_on_every_length() {
        for n in [0, 1, 7, 8, 9, 16, 23, 100] {
            let a: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin() - 0.2).collect();
            let b: Vec<f64> = (0..n).map(|i| (i as f64 * 1.3).cos()).collect();
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * (1.0 + y.abs());
            assert!(close(sum_abs(&a), a.iter().map(|x| x.abs()).sum()), "n {n}");
            assert!(
                close(sum_squares(&a), a.iter().map(|x| x * x).sum()),
                "n {n}"
            );
            assert!(
                close(dot(&a, &b), a.iter().zip(&b).map(|(x, y)| x * y).sum()),
                "n {n}"
            );
        }
        assert!(sum_abs(&[1.0, f64::NAN, 2.0]).is_nan());
        assert!(sum_squares(
            &[0.0; 9]
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .collect::<Vec<_>>()
        )
        .is_infinite());
    }

    #[test]
    fn f32_slices_sum_in_f64() {
        let a: Vec<f32> = (0..19).map(|i| (i as f32 * 0.37).sin() * 3e20).collect();
        let wide: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
        // 3e20² overflows f32 but not the f64 accumulator.
        assert_eq!(sum_squares(&a), sum_squares(&wide));
        assert!(sum_squares(&a).is_finite());
        assert_eq!(sum_abs(&a), sum_abs(&wide));
        assert_eq!(dot(&a, &wide), dot(&wide, &wide));
    }

    #[test]
    fn values_are_borrowed_only_from_contiguous_cpu_storage() {
        use candle_core::{Device, Tensor};
        let t = Tensor::arange(0f32, 12., &Device::Cpu)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        let sum = with_host_values(&t.narrow(0, 1, 2).unwrap(), |v| match v {
            HostValues::F32(s) => s.iter().sum::<f32>(),
            HostValues::F64(_) => f32::NAN,
        });
        assert_eq!(sum, Some((4..12).sum::<i32>() as f32));
        // A transposed view is strided: no borrow, and host_f64 still returns its values.
        let tt = t.t().unwrap();
        assert!(with_host_values(&tt, |_| ()).is_none());
        assert_eq!(host_f64(&tt).unwrap()[..3], [0.0, 4.0, 8.0]);
        let ints = Tensor::new(&[1u32, 2], &Device::Cpu).unwrap();
        assert!(with_host_values(&ints, |_| ()).is_none());
        assert_eq!(host_f64(&ints).unwrap(), [1.0, 2.0]);
    }
}

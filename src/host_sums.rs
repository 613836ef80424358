//! Host-side `f64` work for the CPU paths of the losses and the batch checks: a tensor's values
//! as `f64`, and reductions over `f64` slices with independent partial sums.
//!
//! Why partial sums: a single running sum `s += x` is bound by the latency of the floating-point add (about
//! four cycles per element), because the compiler may not reorder floating-point additions.
//! Eight partial sums break that chain and let it use SIMD registers; on the loss engine's
//! `B × 512` passes that is several times faster. The results differ from a left-to-right sum
//! only by rounding.

use crate::error::Result;
use candle_core::{DType, Tensor};

const LANES: usize = 8;

/// Row-major values of a CPU or device tensor as `f64` (one copy; `f32` and `f64` without a
/// candle cast, which on large tensors would run on candle's own thread pool).
pub fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
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

/// `Σ f(aᵢ)` with [`LANES`] partial sums, added pairwise at the end.
#[inline]
fn lane_sum(a: &[f64], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0f64; LANES];
    let chunks = a.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (s, &x) in acc.iter_mut().zip(c) {
            *s += f(x);
        }
    }
    let tail: f64 = rest.iter().map(|&x| f(x)).sum();
    reduce(acc) + tail
}

#[inline]
fn reduce(acc: [f64; LANES]) -> f64 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `Σ |aᵢ|` (NaN and infinity propagate).
pub fn sum_abs(a: &[f64]) -> f64 {
    lane_sum(a, f64::abs)
}

/// `Σ aᵢ²`.
pub fn sum_squares(a: &[f64]) -> f64 {
    lane_sum(a, |x| x * x)
}

/// `Σ aᵢ bᵢ` over the common length.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    reduce(acc) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

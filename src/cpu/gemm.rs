//! Matrix products on strided views, through the `gemm` crate (candle's own CPU GEMM), called
//! directly where candle's `matmul` costs more than the product: it allocates (and zeroes) its
//! output on every call, and splits every small product over all threads.

use candle_core::WithDType;

/// A strided matrix view: entry `(r, c)` is `data[r·rs + c·cs]`.
#[derive(Clone, Copy)]
pub struct Matrix<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T> Matrix<'a, T> {
    /// `data` as a row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Matrix {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose, as a view of the same values.
    pub fn t(self) -> Self {
        Matrix {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst = a · b` (`accumulate`: `dst += a · b`), `dst` row-major `a.rows × b.cols`, on
/// `threads` threads of rayon's pool (1: the calling thread only, for callers that parallelise
/// over their own parts of the work).
///
/// # Panics
/// If the shapes do not chain or a view reaches past its data: a programming error.
pub fn gemm_into<T: WithDType>(
    dst: &mut [T],
    a: Matrix<T>,
    b: Matrix<T>,
    accumulate: bool,
    threads: usize,
) {
    assert!(a.cols == b.rows && dst.len() == a.rows * b.cols);
    assert!(a.in_bounds() && b.in_bounds());
    if dst.is_empty() {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            dst.fill(T::zero());
        }
        return;
    }
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the three views are in bounds (checked above) and `dst`, a unique borrow, does not
    // overlap `a` or `b`; gemm reads `dst` only with `read_dst`.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            dst.as_mut_ptr(),
            1,
            b.cols as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The `cols × rows` transpose of a row-major `rows × cols` matrix, in 32 × 32 tiles so that
/// both sides are read and written a cache line at a time.
pub fn transposed<T: WithDType>(m: &[T], rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 32;
    assert_eq!(m.len(), rows * cols);
    let mut t = vec![T::zero(); m.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    t[c * rows + r] = m[r * cols + c];
                }
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_matches_the_definition_across_tile_edges() {
        for (rows, cols) in [(1, 1), (3, 70), (33, 32), (64, 5)] {
            let m: Vec<f64> = (0..rows * cols).map(|i| i as f64).collect();
            let t = transposed(&m, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        t[c * rows + r],
                        m[r * cols + c],
                        "{rows}×{cols} at ({r}, {c})"
                    );
                }
            }
        }
    }

    /// Every orientation of the operands, accumulation, and one or two threads, against the
    /// triple loop (integer-valued entries: exact in any summation order).
    #[test]
    fn products_of_strided_views_match_the_triple_loop() {
        let (m, k, n) = (37, 19, 53);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 13) as f64 - 6.0).collect();
        let mut want = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        let (at, bt) = (transposed(&a, m, k), transposed(&b, k, n));
        for threads in [1, 2] {
            for (a_view, b_view) in [
                (Matrix::row_major(&a, m, k), Matrix::row_major(&b, k, n)),
                (
                    Matrix::row_major(&at, k, m).t(),
                    Matrix::row_major(&b, k, n),
                ),
                (
                    Matrix::row_major(&a, m, k),
                    Matrix::row_major(&bt, n, k).t(),
                ),
                (
                    Matrix::row_major(&at, k, m).t(),
                    Matrix::row_major(&bt, n, k).t(),
                ),
            ] {
                let mut dst = vec![f64::NAN; m * n];
                gemm_into(&mut dst, a_view, b_view, false, threads);
                assert_eq!(dst, want);
                gemm_into(&mut dst, a_view, b_view, true, threads);
                assert!(dst.iter().zip(&want).all(|(d, w)| *d == 2.0 * w));
            }
        }
    }
}

//! The point of minimum Euclidean norm in the convex hull of a finite set of vectors, by
//! Wolfe's algorithm (P. Wolfe, "Finding the nearest point in a polytope", Math. Programming
//! 1976): a finite active-set method whose answer is exact up to rounding.
//!
//! Used by DQE ([`super::query_expansion`]): the hard-margin SVM with bias separating two point
//! sets has `w ∝ p* − n*`, the closest points of their convex hulls, i.e. the minimum-norm point
//! of the hull of the differences `{p_i − n_j}`.

use crate::error::{Error, Result};

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Solves the bordered system `[G 1; 1ᵀ 0] [μ; ν] = [0; 1]` (the affine minimiser of the
/// points whose Gram matrix is `G`), by Gaussian elimination with partial pivoting. `None` if
/// the system is singular (affinely dependent points).
fn affine_minimizer(gram: &[Vec<f64>]) -> Option<Vec<f64>> {
    let n = gram.len();
    let mut a: Vec<Vec<f64>> = (0..=n)
        .map(|i| {
            let mut row: Vec<f64> = (0..=n)
                .map(|j| match (i < n, j < n) {
                    (true, true) => gram[i][j],
                    (false, false) => 0.0,
                    _ => 1.0,
                })
                .collect();
            row.push(if i == n { 1.0 } else { 0.0 });
            row
        })
        .collect();
    let scale = gram.iter().flatten().fold(1.0f64, |m, v| m.max(v.abs()));
    for col in 0..=n {
        let pivot = (col..=n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[pivot][col].abs() <= 1e-13 * scale {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            if r != col && f != 0.0 {
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n + 1] / a[i][i]).collect())
}

/// Convex weights `λ` (one per point, summing to 1) of the minimum-norm point of the hull of
/// `points`, and that point. Errors if `points` is empty, the dimensions differ, or the
/// algorithm does not converge in `100 · (points + 1)` major steps.
pub fn min_norm_point(points: &[Vec<f64>]) -> Result<(Vec<f64>, Vec<f64>)> {
    let m = points.len();
    let dim = points.first().map(Vec::len).ok_or_else(|| {
        Error::invalid(
            "points",
            "the minimum-norm point of an empty set is undefined",
        )
    })?;
    if points.iter().any(|p| p.len() != dim) {
        return Err(Error::Shape("points of different dimensions".into()));
    }
    let scale = points
        .iter()
        .map(|p| dot(p, p))
        .fold(0.0, f64::max)
        .max(1e-300);
    let tol = 1e-12 * scale;
    let combine = |set: &[usize], lam: &[f64]| -> Vec<f64> {
        let mut x = vec![0.0; dim];
        for (&i, &l) in set.iter().zip(lam) {
            for (a, v) in x.iter_mut().zip(&points[i]) {
                *a += l * v;
            }
        }
        x
    };
    let start = (0..m)
        .min_by(|&a, &b| dot(&points[a], &points[a]).total_cmp(&dot(&points[b], &points[b])))
        .unwrap_or(0);
    let mut set = vec![start];
    let mut lam = vec![1.0];
    let mut x = points[start].clone();
    for _ in 0..100 * (m + 1) {
        // Major step: the point most opposed to x; stop when no point improves on x.
        let xx = dot(&x, &x);
        let (j, xv) = (0..m)
            .map(|j| (j, dot(&x, &points[j])))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, xx));
        if xx - xv <= tol || set.contains(&j) {
            let mut weights = vec![0.0; m];
            for (&i, &l) in set.iter().zip(&lam) {
                weights[i] += l;
            }
            return Ok((weights, x));
        }
        set.push(j);
        lam.push(0.0);
        // Minor steps: move to the affine minimiser of the corral, dropping points whose
        // weight would become negative.
        loop {
            let gram: Vec<Vec<f64>> = set
                .iter()
                .map(|&a| set.iter().map(|&b| dot(&points[a], &points[b])).collect())
                .collect();
            let mu = affine_minimizer(&gram).ok_or_else(|| {
                Error::invalid(
                    "points",
                    "Wolfe's algorithm met affinely dependent points (degenerate input)",
                )
            })?;
            if mu.iter().all(|&u| u > 1e-14) {
                lam = mu;
                break;
            }
            let theta = lam
                .iter()
                .zip(&mu)
                .filter(|(_, &u)| u <= 1e-14)
                .map(|(&l, &u)| l / (l - u))
                .fold(1.0, f64::min);
            for (l, u) in lam.iter_mut().zip(&mu) {
                *l = theta * u + (1.0 - theta) * *l;
            }
            let keep: Vec<bool> = lam.iter().map(|&l| l > 1e-14).collect();
            set = set
                .iter()
                .zip(&keep)
                .filter(|(_, &k)| k)
                .map(|(&s, _)| s)
                .collect();
            lam.retain(|&l| l > 1e-14);
            let total: f64 = lam.iter().sum();
            lam.iter_mut().for_each(|l| *l /= total);
        }
        x = combine(&set, &lam);
    }
    Err(Error::invalid(
        "points",
        "Wolfe's minimum-norm-point algorithm did not converge",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_and_triangle() {
        // The segment from (1, 1) to (1, -3): nearest point to the origin is (1, 0).
        let (w, x) = min_norm_point(&[vec![1.0, 1.0], vec![1.0, -3.0]]).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-12 && x[1].abs() < 1e-12, "{x:?}");
        assert!((w[0] - 0.75).abs() < 1e-12 && (w[1] - 0.25).abs() < 1e-12);
        // A triangle containing the origin: the minimum-norm point is 0.
        let (_, x) = min_norm_point(&[vec![1.0, 0.0], vec![-1.0, 1.0], vec![-1.0, -1.0]]).unwrap();
        assert!(x.iter().all(|v| v.abs() < 1e-9), "{x:?}");
        // A vertex is the answer when the hull lies beyond it: (2, 0) nearer than (3, ±1).
        let (w, x) = min_norm_point(&[vec![3.0, 1.0], vec![2.0, 0.0], vec![3.0, -1.0]]).unwrap();
        assert_eq!(x, vec![2.0, 0.0]);
        assert_eq!(w, vec![0.0, 1.0, 0.0]);
        assert!(min_norm_point(&[]).is_err());
        assert!(min_norm_point(&[vec![1.0], vec![1.0, 2.0]]).is_err());
    }
}

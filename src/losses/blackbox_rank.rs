//! Blackbox differentiation of ranking (Rolínek et al., RaMBO, CVPR 2020, Sec. 3.2–4.1,
//! Algorithm 1), as a candle [`CustomOp1`].
//!
//! Forward: the descending rank of every entry of a score vector, or of every row of a score
//! matrix (RaMBO Eq. 1–2: the highest score gets rank 1). Backward: with `g = ∂L/∂rk` the
//! incoming gradient, the scores are perturbed to `y_λ = y + λ·g`, ranked again, and
//! `∂L/∂y := −(rk(y) − rk(y_λ)) / λ` is returned (RaMBO Eq. 10 with Algorithm 1).
//!
//! **Tie rule.** The paper only considers proper rankings (no ties). Here equal scores are
//! ranked by position: the earlier index gets the better (smaller) rank, so the result is
//! always a permutation and `rk_i = 1 + |{j : y_j > y_i}| + |{j < i : y_j = y_i}|`. The
//! authors' `argsort(argsort(y).flip(1))` leaves ties to `torch.argsort`, which is not stable;
//! where it happens to be stable, the flip gives the *later* index the better rank.
//!
//! **Rank units.** [`RankUnits::Normalised`] is the authors' convention
//! (`blackbox-backprop/ranking.py`, copied by ROADMAP and SupRank): `(rank₀ + 1)/n` with `rank₀`
//! the 0-based rank and `n` the row length, so ranks lie in `(0, 1]` and the authors computed
//! them in float32 (ours are computed exactly and returned in the input dtype).
//! [`RankUnits::Integer`] gives the paper's ranks `1..=n`. λ lives in the units of the ranks:
//! the same numeric λ perturbs `n` times more strongly with normalised ranks, because the
//! incoming gradient `∂L/∂rk` of a loss written on normalised ranks is `n` times larger. The
//! authors divide by `λ + 1e-8`; we divide by `λ` (the difference is below float32 resolution
//! for the λ values used, 0.5 to 4).

use crate::error::{Error, Result};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

/// Units of the ranks produced by [`blackbox_rank`] (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankUnits {
    /// Ranks `1..=n` (RaMBO Eq. 2).
    Integer,
    /// Ranks `(rank₀ + 1) / n ∈ (0, 1]`, the authors' `rank_normalised`.
    #[default]
    Normalised,
}

impl RankUnits {
    /// The rank value of the 1-based integer rank `rank` in a sequence of length `n`.
    pub fn value(self, rank: usize, n: usize) -> f64 {
        match self {
            RankUnits::Integer => rank as f64,
            RankUnits::Normalised => rank as f64 / n as f64,
        }
    }
}

/// An integer with the order of `x` (not NaN): `order_key(a) < order_key(b)` exactly when
/// `a < b`, and −0.0 and +0.0 get the same key (they compare equal).
#[inline]
fn order_key(x: f64) -> u64 {
    // −0.0 + 0.0 = +0.0; every other value is unchanged.
    let bits = (x + 0.0).to_bits();
    if bits >> 63 == 1 {
        !bits // negative: a larger magnitude is smaller
    } else {
        bits | (1 << 63)
    }
}

/// 1-based descending ranks of `scores` (RaMBO Eq. 2) with the tie rule of the module
/// documentation (equal scores: the earlier index ranks first). `scores` must not contain NaN.
pub fn descending_ranks(scores: &[f64]) -> Vec<usize> {
    // Sorting (key, index) pairs of integers gives the order (descending score, then ascending
    // index) with the tuples' own comparison instead of a `partial_cmp` closure with its NaN
    // branch. The key is inverted for the descending order.
    let mut order: Vec<(u64, usize)> = scores.iter().map(|&s| !order_key(s)).zip(0..).collect();
    order.sort_unstable();
    let mut ranks = vec![0usize; scores.len()];
    for (position, &(_, i)) in order.iter().enumerate() {
        ranks[i] = position + 1;
    }
    ranks
}

/// Whether entry `a` (score `ya`) ranks ahead of entry `b` (score `yb`) under the tie rule.
#[inline(always)]
fn ahead(ya: f64, a: usize, yb: f64, b: usize) -> bool {
    ya > yb || (ya == yb && a < b)
}

/// The ranks [`descending_ranks`] gives the entries `which` of `scores` (in the order of
/// `which`), found by counting the entries ahead of each: `O(n · which.len())` without sorting,
/// for losses that read only a few ranks (RaMBO's read the relevant items' ranks only).
pub fn ranks_of(scores: &[f64], which: &[usize]) -> Vec<usize> {
    which
        .iter()
        .map(|&i| 1 + ahead_of(scores, i, scores[i]))
        .collect()
}

/// The entries of `scores` other than `i` that rank ahead of entry `i` if its score were `y`:
/// earlier entries when ≥ `y` (ties go to the earlier index), later ones when > `y`. Counted
/// branch-free so that the loops can vectorise.
fn ahead_of(scores: &[f64], i: usize, y: f64) -> usize {
    let before: usize = scores[..i].iter().map(|&s| usize::from(s >= y)).sum();
    let after: usize = scores[i + 1..].iter().map(|&s| usize::from(s > y)).sum();
    before + after
}

/// The most perturbed entries for which [`sparse_blackbox_gradient`] updates ranks instead of
/// sorting: the update costs `O(n · k)` for `k` perturbed entries against the sort's
/// `O(n log n)`.
const MOST_MOVES: usize = 32;

/// The rank changes `rk(y + λ·g) − rk(y)` of the entries that do not move (`moved`: the
/// entries with `g ≠ 0` and their new scores); the moved entries' own slots are left at 0.
///
/// An unmoved entry keeps its order with every other unmoved entry, so its rank changes by the
/// moved entries that are ahead of it now minus those that were ahead before. A moved entry
/// `i` is ahead of an entry `j < i` only on a strictly larger score, of one after it on a
/// larger or equal one (the tie rule); the two sides are separate loops so that they compile
/// to branch-free vector code.
fn unmoved_rank_changes(scores: &[f64], moved: &[(usize, f64)]) -> Vec<isize> {
    let mut change = vec![0isize; scores.len()];
    for &(i, yi) in moved {
        let y0 = scores[i];
        let (change_before, rest) = change.split_at_mut(i);
        for (c, &y) in change_before.iter_mut().zip(&scores[..i]) {
            *c += isize::from(yi > y) - isize::from(y0 > y);
        }
        for (c, &y) in rest[1..].iter_mut().zip(&scores[i + 1..]) {
            *c += isize::from(yi >= y) - isize::from(y0 >= y);
        }
    }
    for &(i, _) in moved {
        change[i] = 0;
    }
    change
}

/// The rank of moved entry `i` at its new score `yi`: counted over the old scores, then
/// corrected for the other moved entries' new scores.
fn moved_rank(scores: &[f64], moved: &[(usize, f64)], i: usize, yi: f64) -> usize {
    let mut rank = 1 + ahead_of(scores, i, yi);
    for &(k, yk) in moved {
        if k != i {
            rank =
                rank + usize::from(ahead(yk, k, yi, i)) - usize::from(ahead(scores[k], k, yi, i));
        }
    }
    rank
}

/// [`blackbox_gradient`] of the ranks of `scores` (`−(rk(y) − rk(y + λ·g))/λ`, RaMBO
/// Algorithm 1) without sorting, when few entries of `grad` are non-zero — RaMBO's losses read
/// only the relevant items' ranks, so only those entries move. The same values bit for bit.
///
/// Only the moved entries and the entries they pass change rank; every other entry's gradient
/// is `−(r − r)/λ = −0` whatever its rank `r`. So the ranks needed are those of the moved and
/// the passed entries, counted one by one (`O(n)` each) unless so many are passed that one sort
/// costs less. Falls back to [`blackbox_gradient`] when more than `MOST_MOVES` entries move.
pub fn sparse_blackbox_gradient(
    scores: &[f64],
    grad: &[f64],
    lambda: f64,
    units: RankUnits,
) -> Vec<f64> {
    let n = scores.len();
    // The same arithmetic as the dense path: y + λ·g (y itself where g = 0).
    let moved: Vec<(usize, f64)> = grad
        .iter()
        .enumerate()
        .filter(|&(_, &g)| g != 0.0)
        .map(|(i, &g)| (i, scores[i] + lambda * g))
        .collect();
    if moved.len() > MOST_MOVES {
        return blackbox_gradient(scores, &rank_values(scores, units), grad, lambda, units);
    }
    let gradient = |r: usize, rl: usize| -(units.value(r, n) - units.value(rl, n)) / lambda;
    // The dense path's value for an entry whose rank does not change: −(r − r)/λ = −0/λ.
    let unchanged = -0.0f64 / lambda;
    let change = unmoved_rank_changes(scores, &moved);
    let passed: Vec<usize> = (0..n).filter(|&j| change[j] != 0).collect();
    let mut out = vec![unchanged; n];
    // A sort costs about n·log₂(n) comparisons and a count about n: count while the passed
    // entries number at most 2·log₂(n) (an estimate of the break-even, erring on the sort).
    let most_counted = 2 * (usize::BITS - n.leading_zeros()) as usize;
    if passed.len() + moved.len() <= most_counted {
        let which: Vec<usize> = passed
            .iter()
            .chain(moved.iter().map(|m| &m.0))
            .copied()
            .collect();
        let ranks = ranks_of(scores, &which);
        for (&j, &r) in passed.iter().zip(&ranks) {
            out[j] = gradient(r, r.wrapping_add_signed(change[j]));
        }
        for (&(i, yi), &r) in moved.iter().zip(&ranks[passed.len()..]) {
            out[i] = gradient(r, moved_rank(scores, &moved, i, yi));
        }
    } else {
        let ranks = descending_ranks(scores);
        for &j in &passed {
            out[j] = gradient(ranks[j], ranks[j].wrapping_add_signed(change[j]));
        }
        for &(i, yi) in &moved {
            out[i] = gradient(ranks[i], moved_rank(scores, &moved, i, yi));
        }
    }
    out
}

/// Ranks of `scores` as values in `units`.
pub fn rank_values(scores: &[f64], units: RankUnits) -> Vec<f64> {
    let n = scores.len();
    descending_ranks(scores)
        .into_iter()
        .map(|r| units.value(r, n))
        .collect()
}

/// The blackbox gradient of RaMBO Algorithm 1 for one sequence: with `y` the scores, `rk` their
/// ranks (in `units`) and `grad` the incoming `∂L/∂rk`, returns
/// `−(rk − rk(y + λ·grad)) / λ`.
pub fn blackbox_gradient(
    scores: &[f64],
    ranks: &[f64],
    grad: &[f64],
    lambda: f64,
    units: RankUnits,
) -> Vec<f64> {
    let perturbed: Vec<f64> = scores
        .iter()
        .zip(grad)
        .map(|(y, g)| y + lambda * g)
        .collect();
    let ranks_lambda = rank_values(&perturbed, units);
    ranks
        .iter()
        .zip(&ranks_lambda)
        .map(|(r, rl)| -(r - rl) / lambda)
        .collect()
}

/// Validates the interpolation strength λ of the blackbox gradient.
pub fn check_lambda(lambda: f64) -> Result<()> {
    if !lambda.is_finite() || lambda <= 0.0 {
        return Err(Error::invalid(
            "lambda",
            format!("must be finite and > 0, got {lambda}"),
        ));
    }
    Ok(())
}

/// The ranking "solver" of RaMBO as a candle op: descending ranks along the last dimension of a
/// contiguous `f64` CPU tensor of rank 1 or 2, with the blackbox backward of Algorithm 1.
///
/// Use [`blackbox_rank`], which accepts any float dtype and device and converts around the op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlackboxRank {
    /// Interpolation strength λ > 0 (RaMBO Eq. 10), in the units of the ranks.
    pub lambda: f64,
    /// Units of the returned ranks.
    pub units: RankUnits,
}

impl BlackboxRank {
    fn rows(shape: &Shape) -> candle_core::Result<(usize, usize)> {
        match shape.dims() {
            [n] => Ok((1, *n)),
            [r, n] => Ok((*r, *n)),
            d => Err(candle_core::Error::Msg(format!(
                "blackbox rank expects a vector or a matrix, got shape {d:?}"
            ))),
        }
    }
}

impl CustomOp1 for BlackboxRank {
    fn name(&self) -> &'static str {
        "rankwise-blackbox-rank"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, n) = Self::rows(layout.shape())?;
        let data = match (storage, layout.contiguous_offsets()) {
            (CpuStorage::F64(v), Some((start, end))) => &v[start..end],
            _ => {
                return Err(candle_core::Error::Msg(
                    "blackbox rank expects a contiguous f64 tensor".into(),
                ))
            }
        };
        let mut out = Vec::with_capacity(rows * n);
        for r in 0..rows {
            out.extend(rank_values(&data[r * n..(r + 1) * n], self.units));
        }
        Ok((CpuStorage::F64(out), layout.shape().clone()))
    }

    fn bwd(
        &self,
        scores: &Tensor,
        ranks: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let (rows, n) = Self::rows(scores.shape())?;
        let flat = |t: &Tensor| -> candle_core::Result<Vec<f64>> {
            t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
        };
        let (y, rk, g) = (flat(scores)?, flat(ranks)?, flat(grad_res)?);
        let mut out = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let span = r * n..(r + 1) * n;
            out.extend(blackbox_gradient(
                &y[span.clone()],
                &rk[span.clone()],
                &g[span],
                self.lambda,
                self.units,
            ));
        }
        Ok(Some(Tensor::from_vec(
            out,
            scores.shape(),
            scores.device(),
        )?))
    }
}

/// Differentiable ranking of a score vector, or of each row of a score matrix (RaMBO
/// Algorithm 1): descending ranks in `units`, with the blackbox gradient of strength `lambda`.
///
/// Accepts any float dtype and device: the op runs on the CPU in `f64` and the result comes
/// back in the dtype and on the device of `scores` (both conversions are differentiable).
/// Errors on a tensor that is not 1- or 2-dimensional, on NaN or infinite scores and on
/// λ ≤ 0.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::blackbox_rank::{blackbox_rank, RankUnits};
/// let y = Tensor::new(&[0.1f64, 0.9, 0.5], &Device::Cpu)?;
/// // The highest score gets rank 1 (RaMBO Eq. 2).
/// let ranks = blackbox_rank(&y, 1.0, RankUnits::Integer)?;
/// assert_eq!(ranks.to_vec1::<f64>()?, [3.0, 1.0, 2.0]);
/// let normalised = blackbox_rank(&y, 1.0, RankUnits::Normalised)?.to_vec1::<f64>()?;
/// assert_eq!(normalised, [1.0, 1.0 / 3.0, 2.0 / 3.0]);
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn blackbox_rank(scores: &Tensor, lambda: f64, units: RankUnits) -> Result<Tensor> {
    check_lambda(lambda)?;
    if !matches!(scores.rank(), 1 | 2) {
        return Err(Error::Shape(format!(
            "blackbox rank expects a vector or a matrix of scores, got shape {:?}",
            scores.dims()
        )));
    }
    let (dtype, device) = (scores.dtype(), scores.device().clone());
    let cpu = scores
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .contiguous()?;
    let values = cpu.flatten_all()?.to_vec1::<f64>()?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid(
            "scores",
            format!("entry {i} (row-major) is NaN or infinite"),
        ));
    }
    let ranks = cpu.apply_op1(BlackboxRank { lambda, units })?;
    Ok(ranks.to_dtype(dtype)?.to_device(&device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_descend_and_break_ties_by_index() {
        assert_eq!(descending_ranks(&[0.1, 0.9, 0.5]), vec![3, 1, 2]);
        assert_eq!(descending_ranks(&[0.5, 0.9, 0.5, 0.5]), vec![2, 1, 3, 4]);
        assert_eq!(descending_ranks(&[0.0, -0.0, -0.0, 0.0]), vec![1, 2, 3, 4]);
        assert_eq!(
            rank_values(&[0.1, 0.9, 0.5, 0.3], RankUnits::Normalised),
            vec![1.0, 0.25, 0.5, 0.75]
        );
    }

    #[test]
    fn gradient_of_a_hand_worked_case() {
        // y = (0.3, 0.2, 0.1) has integer ranks (1, 2, 3). With g = (0, 0, −0.25) and λ = 1,
        // y_λ = (0.3, 0.2, −0.15) keeps the order, so the gradient is 0.
        let y = [0.3, 0.2, 0.1];
        let rk = rank_values(&y, RankUnits::Integer);
        let g = [0.0, 0.0, -0.25];
        assert_eq!(
            blackbox_gradient(&y, &rk, &g, 1.0, RankUnits::Integer),
            vec![0.0, 0.0, 0.0]
        );
        // g = (0, 0, 0.15) with λ = 2: y_λ = (0.3, 0.2, 0.4), so item 3 jumps to rank 1 and
        // items 1, 2 drop to ranks 2, 3: −(rk − rk_λ)/λ = −((1, 2, 3) − (2, 3, 1))/2.
        let g = [0.0, 0.0, 0.15];
        assert_eq!(
            blackbox_gradient(&y, &rk, &g, 2.0, RankUnits::Integer),
            vec![0.5, 0.5, -1.0]
        );
    }

    /// Scores on a coarse grid (many ties, ±0) and a gradient with `k` non-zero entries.
    fn tied_case(n: usize, k: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let scores: Vec<f64> = (0..n)
            .map(|_| {
                let v = f64::from(rng.random_range(-4i32..=4)) / 4.0;
                if v == 0.0 && rng.random_bool(0.5) {
                    -0.0
                } else {
                    v
                }
            })
            .collect();
        let mut grad = vec![0.0; n];
        for _ in 0..k {
            let i = rng.random_range(0..n);
            grad[i] = f64::from(rng.random_range(-8i32..=8)) / 8.0;
        }
        (scores, grad)
    }

    #[test]
    fn the_key_sort_gives_the_comparison_sort_ranks() {
        for seed in 0..50 {
            let (scores, _) = tied_case(40, 0, seed);
            let mut order: Vec<(f64, usize)> = scores.iter().copied().zip(0..).collect();
            order.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
            let mut expected = vec![0; scores.len()];
            for (p, &(_, i)) in order.iter().enumerate() {
                expected[i] = p + 1;
            }
            assert_eq!(descending_ranks(&scores), expected, "seed {seed}");
        }
        let extremes = [
            f64::INFINITY,
            -f64::MAX,
            f64::MIN_POSITIVE,
            -0.0,
            f64::NEG_INFINITY,
        ];
        assert_eq!(descending_ranks(&extremes), vec![1, 4, 2, 3, 5]);
    }

    #[test]
    fn counted_ranks_and_the_sparse_gradient_equal_the_sorting_path() {
        for seed in 0..200 {
            let n = 1 + (seed as usize * 7919 % 300);
            let k = seed as usize % (MOST_MOVES + 8); // above MOST_MOVES: the sorting path
            let (scores, grad) = tied_case(n, k, seed);
            let ranks = descending_ranks(&scores);
            let which: Vec<usize> = (0..n).rev().step_by(2).collect();
            let counted = ranks_of(&scores, &which);
            assert!(
                which.iter().zip(&counted).all(|(&i, &r)| ranks[i] == r),
                "seed {seed}"
            );
            for lambda in [0.5, 4.0, 1e-3] {
                for units in [RankUnits::Integer, RankUnits::Normalised] {
                    let dense = blackbox_gradient(
                        &scores,
                        &rank_values(&scores, units),
                        &grad,
                        lambda,
                        units,
                    );
                    let fast = sparse_blackbox_gradient(&scores, &grad, lambda, units);
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&fast), bits(&dense), "seed {seed}, λ {lambda}");
                }
            }
        }
    }

    #[test]
    fn lambda_must_be_positive() {
        assert!(check_lambda(0.0).is_err());
        assert!(check_lambda(f64::NAN).is_err());
        assert!(check_lambda(0.5).is_ok());
    }
}

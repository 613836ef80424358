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

/// 1-based descending ranks of `scores` (RaMBO Eq. 2) with the tie rule of the module
/// documentation (equal scores: the earlier index ranks first). `scores` must not contain NaN.
pub fn descending_ranks(scores: &[f64]) -> Vec<usize> {
    // Sorting (score, index) pairs by descending score, then ascending index, is the stable
    // order, and faster than an indirect sort of indices. `partial_cmp` (not `total_cmp`) so
    // that −0.0 and +0.0 tie, as they compare equal.
    let mut order: Vec<(f64, usize)> = scores.iter().copied().zip(0..).collect();
    order.sort_unstable_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.1.cmp(&b.1))
    });
    let mut ranks = vec![0usize; scores.len()];
    for (position, &(_, i)) in order.iter().enumerate() {
        ranks[i] = position + 1;
    }
    ranks
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

    #[test]
    fn lambda_must_be_positive() {
        assert!(check_lambda(0.0).is_err());
        assert!(check_lambda(f64::NAN).is_err());
        assert!(check_lambda(0.5).is_ok());
    }
}

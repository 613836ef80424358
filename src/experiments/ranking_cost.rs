//! RaMBO Sec. 4.1 and Table 6: the cost of ranking as the sequence grows. "Both the forward and
//! the backward pass cost O(n log n)" — two sorts each — which makes RaMBO "the first" method
//! with truly sub-quadratic complexity for general ranking; Table 6 times the AP loss's forward
//! and backward pass on sequences of 100k to 100M scores (33 ms to 36.4 s on one CPU core).
//!
//! What runs: the AP loss of RaMBO on one sequence of `n` random scores (10% relevant), as its
//! Algorithm 1 computes it — forward: the ranks among all items and among the relevant ones
//! ([`descending_ranks`], one sort each), `AP = mean_{i∈P} rk⁺_i / rk_i`; backward: the
//! blackbox gradient through both rankings ([`blackbox_gradient`], one more sort each) — timed
//! on one thread, several repeats per length. No training: the statement is about the ranking
//! itself. The claim fits `log t = a + b log n` over every repeat and reads the exponent `b`
//! (`n log n` has a local exponent of about 1.06 over these lengths, a quadratic method 2).

use crate::error::{Error, Result};
use crate::losses::blackbox_rank::{blackbox_gradient, descending_ranks, RankUnits};
use crate::report::{Measured, Provenance, Unit};
use rand::{Rng, SeedableRng};

use super::claim::Claim;
use super::table::Measurements;
use super::Scale;

/// The table (the paper's Table 6; ours on this machine's CPU, one thread).
pub const TABLE: &str = "Table 6";
/// The row (as in the published CSV).
pub const ROW: &str = "RaMBO AP loss";
/// The metric (as in the published CSV).
pub const METRIC: &str = "forward+backward time";
/// λ of the blackbox gradient (the paper's AP-loss λ, Sec. 5).
const LAMBDA: f64 = 0.5;
/// Share of relevant items in each sequence.
const RELEVANT: f64 = 0.1;

/// What one scale measures.
#[derive(Debug, Clone, PartialEq)]
pub struct RankingCostConfig {
    /// Sequence lengths, increasing, each a setting `length=…` of the paper's table.
    pub lengths: Vec<usize>,
    /// Timed repeats per length (each on fresh random scores).
    pub repeats: usize,
    /// Seed of the scores.
    pub seed: u64,
}

impl RankingCostConfig {
    /// `tiny`: 1k to 100k, 3 repeats; the other scales: the paper's 100k, 1M and 10M (its
    /// 100M needs 3 GB and a minute per repeat here), 5 repeats.
    pub fn for_scale(scale: Scale) -> Self {
        match scale {
            Scale::Tiny => RankingCostConfig {
                lengths: vec![1_000, 10_000, 100_000],
                repeats: 3,
                seed: 0,
            },
            Scale::Quick | Scale::Standard | Scale::Paper => RankingCostConfig {
                lengths: vec![100_000, 1_000_000, 10_000_000],
                repeats: 5,
                seed: 0,
            },
        }
    }
}

/// The paper's spelling of a length: `100k`, `1M`, `10M`, `100M` (else the number).
fn length_label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// The setting of a length's cells (the published CSV's, CPU).
pub fn setting(n: usize) -> String {
    format!("length={};device=CPU", length_label(n))
}

/// RaMBO's AP loss `1 − AP` of one sequence and its blackbox gradient with respect to the
/// scores (Algorithm 1 through both rankings, integer ranks). Errors without a relevant item.
pub fn ap_loss_and_gradient(
    scores: &[f64],
    relevant: &[bool],
    lambda: f64,
) -> Result<(f64, Vec<f64>)> {
    let positives: Vec<usize> = (0..scores.len()).filter(|&i| relevant[i]).collect();
    if positives.is_empty() {
        return Err(Error::invalid(
            "relevant",
            "the AP loss needs a relevant item",
        ));
    }
    let p = positives.len() as f64;
    // Forward: two rankings.
    let rk: Vec<f64> = descending_ranks(scores)
        .into_iter()
        .map(|r| r as f64)
        .collect();
    let pos_scores: Vec<f64> = positives.iter().map(|&i| scores[i]).collect();
    let rk_pos: Vec<f64> = descending_ranks(&pos_scores)
        .into_iter()
        .map(|r| r as f64)
        .collect();
    let ap = positives
        .iter()
        .zip(&rk_pos)
        .map(|(&i, r)| r / rk[i])
        .sum::<f64>()
        / p;
    // Backward: ∂(1 − AP)/∂rk_i = rk⁺_i / (|P| rk_i²), ∂(1 − AP)/∂rk⁺_i = −1 / (|P| rk_i),
    // each through its ranking's blackbox gradient.
    let mut d_rk = vec![0.0; scores.len()];
    let mut d_rk_pos = vec![0.0; positives.len()];
    for (j, &i) in positives.iter().enumerate() {
        d_rk[i] = rk_pos[j] / (p * rk[i] * rk[i]);
        d_rk_pos[j] = -1.0 / (p * rk[i]);
    }
    let mut grad = blackbox_gradient(scores, &rk, &d_rk, lambda, RankUnits::Integer);
    let grad_pos = blackbox_gradient(&pos_scores, &rk_pos, &d_rk_pos, lambda, RankUnits::Integer);
    for (&i, g) in positives.iter().zip(grad_pos) {
        grad[i] += g;
    }
    Ok((1.0 - ap, grad))
}

/// Times [`ap_loss_and_gradient`] at every length of `config`: one cell per length (in
/// milliseconds, each repeat a sample).
pub fn measure(config: &RankingCostConfig, scale: Scale) -> Result<Vec<Measured>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(config.seed);
    let mut cells = Vec::new();
    for &n in &config.lengths {
        let mut times = Vec::with_capacity(config.repeats);
        for _ in 0..config.repeats {
            let scores: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
            let relevant: Vec<bool> = (0..n).map(|_| rng.random::<f64>() < RELEVANT).collect();
            let start = std::time::Instant::now();
            let (loss, grad) = ap_loss_and_gradient(&scores, &relevant, LAMBDA)?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            // Keep the result alive (and sane) so that nothing is optimised away.
            if !loss.is_finite() || grad.len() != n {
                return Err(Error::invalid(
                    "ranking cost",
                    format!("bad loss at n = {n}"),
                ));
            }
            times.push(ms);
        }
        let provenance = Provenance::new(
            "random scores",
            scale,
            format!(
                "one sequence of {n} uniform scores, {:.0}% relevant, λ = {LAMBDA}; forward (2 \
                 sorts) and blackbox backward (2 sorts), one thread of this machine's CPU; {} \
                 repeats, seed {}",
                RELEVANT * 100.0,
                config.repeats,
                config.seed
            ),
        );
        cells.push(
            Measured::new(TABLE, ROW, "", METRIC, 0.0, Unit::Milliseconds, provenance)
                .with_setting(setting(n))
                .with_samples(times),
        );
    }
    Ok(cells)
}

/// The claim on the measured times: the fitted exponent of `t ∝ n^b` is below 1.5 (closer to
/// `n log n`, about 1.06 here, than to a quadratic method's 2).
pub fn claims(m: &Measurements) -> Vec<Claim> {
    let points: Vec<(f64, Vec<f64>)> = m
        .cells
        .iter()
        .filter(|c| c.table == TABLE && c.method == ROW && c.metric == METRIC)
        .filter_map(|c| {
            let label = c.setting.strip_prefix("length=")?.split(';').next()?;
            let n = parse_length(label)?;
            Some((n, c.samples.clone()))
        })
        .collect();
    vec![Claim::exponent_below(
        "Forward and backward cost O(n log n): the ranking loss is sub-quadratic in the \
         sequence length (Sec. 4.1, Table 6: 33 ms at 100k → 36.4 s at 100M on one CPU core, an \
         exponent of 1.01)",
        &points,
        1.5,
    )]
}

/// `100k` → 1e5, `1M` → 1e6, or a plain number.
fn parse_length(s: &str) -> Option<f64> {
    let (num, scale) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        _ => (s, 1.0),
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ap_loss_is_one_minus_ap_and_its_gradient_raises_the_positives() {
        // Scores 0.9 (neg), 0.85 (pos), 0.1 (pos): ranks 1, 2, 3; among positives 1, 2.
        // AP = (1/2 + 2/3) / 2 = 7/12.
        let scores = [0.9, 0.85, 0.1];
        let relevant = [false, true, true];
        let (loss, grad) = ap_loss_and_gradient(&scores, &relevant, 1.0).unwrap();
        assert!((loss - 5.0 / 12.0).abs() < 1e-12, "{loss}");
        // ∂L/∂rk of the first positive is 1 / (2 · 2²) = 0.125: with λ = 1 its perturbed score
        // 0.975 passes the negative, so it gains one rank and the negative loses one:
        // gradient −(2 − 1) / 1 = −1 and +1; the second positive (0.1 + 2/18) stays third, and
        // the ranking among positives is unchanged by a perturbation that only widens it.
        assert_eq!(grad, vec![1.0, -1.0, 0.0]);
        // A λ too small to reorder anything gives no gradient: the blackbox's known trade-off
        // between faithfulness and informativeness (Fig. 1).
        let (_, flat) = ap_loss_and_gradient(&scores, &relevant, 0.1).unwrap();
        assert_eq!(flat, vec![0.0; 3]);
        assert!(ap_loss_and_gradient(&[0.3], &[false], LAMBDA).is_err());
    }

    #[test]
    fn lengths_read_back_as_the_paper_prints_them() {
        for n in [1_000, 100_000, 1_000_000, 10_000_000, 100_000_000, 123] {
            let s = setting(n);
            let label = s
                .strip_prefix("length=")
                .unwrap()
                .split(';')
                .next()
                .unwrap();
            assert_eq!(parse_length(label), Some(n as f64), "{s}");
        }
        assert_eq!(setting(100_000), "length=100k;device=CPU");
    }

    #[test]
    fn the_timing_grows_subquadratically_at_tiny_scale() {
        let config = RankingCostConfig {
            lengths: vec![2_000, 20_000, 200_000],
            repeats: 3,
            seed: 1,
        };
        let cells = measure(&config, Scale::Tiny).unwrap();
        assert_eq!(cells.len(), 3);
        for c in &cells {
            assert_eq!(c.samples.len(), 3);
            assert!(c.samples.iter().all(|t| *t > 0.0), "{c:?}");
        }
        let m = Measurements {
            cells,
            ..Measurements::default()
        };
        let claims = claims(&m);
        // Sorting is n log n: a quadratic exponent would need a 100× slower machine between
        // two lengths; the verdict must not be "contradicted".
        assert_ne!(
            claims[0].verdict,
            super::super::Verdict::Contradicted,
            "{claims:?}"
        );
        assert!(claims[0].evidence.contains("exponent"), "{claims:?}");
    }
}

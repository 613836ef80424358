//! Whether the runs behind a table had converged: a claim measured on still-rising curves says
//! something about the first epochs, not about the method.
//!
//! The criterion (issue #21's `standard` scale): over the last 20% of the epochs (at least the
//! last two evaluations), the test metric moves by less than half a point (0.005 as a
//! fraction). The metric is each run's test R@1 at the finest level, which every recipe
//! evaluates after each epoch. The experiments' recipes hold no classes out for validation
//! (`[validation]`, [`crate::train::validation`], would change every paper's training set), so
//! the test curve stands in for the validation curve; nothing is selected on it.
//!
//! How far a curve "moves" is read from the least-squares line through the tail: the rise (or
//! fall) of that line from the tail's first epoch to its last. Not the tail's max − min: each
//! evaluation carries noise of its own (near-tied neighbours swap places from one epoch to the
//! next; one run's test R@1 jitters by 0.54 point, s.d., around its level over epochs 81–96 of
//! FastAP's 96-epoch batch-16 pilot, 4 runs), and the range of n noisy points grows with n. A
//! flat curve averaged over 8 such seeds has a max − min of 0.5 point or more in 34% of tails of
//! 5 evaluations and 95% of tails of 20 (simulated): that test would read how often a recipe
//! evaluates, not whether its training still moves. The fitted rise of a flat curve has a
//! spread that shrinks as the tail gets more points (σ·√(12(n − 1)/(n(n + 1))) for n evenly
//! spaced points of noise σ), and a curve that does drift by d over the tail is read as d.

use super::runs::RunResult;
use super::table::Measurements;

/// The fraction of the epochs the criterion looks at.
pub const TAIL: f64 = 0.2;
/// The largest drift (as a fraction, either sign) of the fitted line allowed over the tail.
pub const TOLERANCE: f64 = 0.005;

/// How far `curve` (`(epoch, value)`, in epoch order) moved over its last [`TAIL`] of epochs (at
/// least its last two points): the absolute rise of the least-squares line through those points
/// from the first of their epochs to the last ([`tail_drift`] without its sign); `None` with
/// fewer than two points. Two points give their difference exactly.
///
/// ```
/// use rankwise::experiments::convergence::tail_move;
/// // Still rising by 0.2 point per epoch: epochs 8–10 of 10 move by 0.4 point.
/// let rising: Vec<(u64, f64)> = (0..=10).map(|e| (e, 0.3 + 0.002 * e as f64)).collect();
/// assert!((tail_move(&rising).unwrap() - 0.004).abs() < 1e-12);
/// // Flat, jittering by a point from one epoch to the next: no drift.
/// let flat: Vec<(u64, f64)> = (0..=10).map(|e| (e, 0.3 + 0.01 * (e % 2) as f64)).collect();
/// assert!(tail_move(&flat).unwrap() < 1e-12);
/// ```
pub fn tail_move(curve: &[(u64, f64)]) -> Option<f64> {
    tail_drift(curve).map(f64::abs)
}

/// The signed rise of the least-squares line through the last [`TAIL`] of `curve`'s epochs (at
/// least its last two points), from the first of their epochs to the last: positive while the
/// metric still climbs, negative once it has passed its peak and falls — the two call for
/// different remedies (a longer schedule, or an earlier stop), so the tables say which.
///
/// ```
/// use rankwise::experiments::convergence::tail_drift;
/// let falling: Vec<(u64, f64)> = (0..=10).map(|e| (e, 0.5 - 0.002 * e as f64)).collect();
/// assert!((tail_drift(&falling).unwrap() + 0.004).abs() < 1e-12);
/// ```
pub fn tail_drift(curve: &[(u64, f64)]) -> Option<f64> {
    if curve.len() < 2 {
        return None;
    }
    let last = curve.last()?.0;
    let from = last as f64 - TAIL * last as f64;
    let mut tail: Vec<(f64, f64)> = curve
        .iter()
        .filter(|(e, _)| *e as f64 >= from)
        .map(|&(e, v)| (e as f64, v))
        .collect();
    if tail.len() < 2 {
        tail = curve[curve.len() - 2..]
            .iter()
            .map(|&(e, v)| (e as f64, v))
            .collect();
    }
    // None when every point sits at one epoch (a malformed curve): no span to move over.
    let fit = crate::stats::LineFit::new(&tail)?;
    let span = tail[tail.len() - 1].0 - tail[0].0;
    Some(fit.slope * span)
}

/// Whether one run converged by the criterion (`None`: too few evaluations to tell).
pub fn converged(run: &RunResult) -> Option<bool> {
    tail_move(&run.curve("R@1", Some(0))).map(|m| m < TOLERANCE)
}

/// The mean of several `(epoch, value)` curves at the epochs every one of them has.
pub fn mean_curve(curves: &[Vec<(u64, f64)>]) -> Vec<(u64, f64)> {
    let Some(first) = curves.first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter_map(|&(epoch, _)| {
            let values: Vec<f64> = curves
                .iter()
                .filter_map(|c| c.iter().find(|p| p.0 == epoch).map(|p| p.1))
                .collect();
            (values.len() == curves.len())
                .then(|| (epoch, values.iter().sum::<f64>() / values.len() as f64))
        })
        .collect()
}

/// One sentence on the convergence of `m`'s rows and runs; `None` when `m` has no training
/// runs. A row converged when the mean over its seeds of the test R@1 curve moved by less than
/// [`TOLERANCE`] over its last [`TAIL`] of epochs ([`tail_move`]): the claims compare those
/// means, and the mean over seeds shows the drift with less of each run's jitter.
/// Single runs are counted too. Rows and runs that several tables share are counted once. The
/// rows outside the rule are named, each with its signed move ([`tail_drift`]).
pub fn describe(m: &Measurements) -> Option<String> {
    let mut seen_runs: Vec<&str> = Vec::new();
    let (mut done, mut total, mut worst) = (0usize, 0usize, 0.0f64);
    for run in m.runs.iter().flat_map(|r| &r.runs) {
        if seen_runs.contains(&run.recipe.as_str()) {
            continue;
        }
        seen_runs.push(&run.recipe);
        let Some(moved) = tail_move(&run.curve("R@1", Some(0))) else {
            continue;
        };
        total += 1;
        if moved < TOLERANCE {
            done += 1;
        }
        worst = worst.max(moved);
    }
    let mut seen_rows: Vec<&str> = Vec::new();
    let (mut rows_done, mut rows, mut rows_worst) = (0usize, 0usize, 0.0f64);
    let mut outside: Vec<String> = Vec::new();
    for row in &m.runs {
        let Some(first) = row.runs.first() else {
            continue;
        };
        if seen_rows.contains(&first.recipe.as_str()) {
            continue;
        }
        seen_rows.push(&first.recipe);
        let curves: Vec<_> = row.runs.iter().map(|r| r.curve("R@1", Some(0))).collect();
        let Some(drift) = tail_drift(&mean_curve(&curves)) else {
            continue;
        };
        rows += 1;
        if drift.abs() < TOLERANCE {
            rows_done += 1;
        } else {
            let name = super::table::row_name(&row.method, &row.setting);
            outside.push(format!("{name} {:+.1}", 100.0 * drift));
        }
        rows_worst = rows_worst.max(drift.abs());
    }
    (total > 0).then(|| {
        format!(
            "Convergence: {rows_done} of {rows} rows converged (the line fitted to the mean over \
             their seeds of the test R@1 over the last 20% of the epochs rose or fell by less than \
             0.5 point; the largest move was {:.1} points), and {done} of {total} single runs \
             (largest {:.1} points){}.",
            100.0 * rows_worst,
            100.0 * worst,
            if rows_done < rows {
                format!(
                    ": the verdicts describe training that had not converged. Rows outside the \
                     rule, with their seed-mean tail's move in R@1 points (+ still rising, - \
                     past their peak and falling): {}",
                    outside.join(", ")
                )
            } else {
                String::new()
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_the_last_fifth_or_the_last_two_points() {
        let rising: Vec<(u64, f64)> = (0..=4).map(|e| (e, 0.1 + 0.02 * e as f64)).collect();
        // 4 epochs: the tail is epochs ≥ 3.2, one point, so the last two: 0.16 → 0.18.
        assert!((tail_move(&rising).unwrap() - 0.02).abs() < 1e-12);
        // 20 epochs: the tail is epochs 16–20, and a fall counts as a move.
        let falling: Vec<(u64, f64)> = (0..=20).map(|e| (e, 0.5 - 0.002 * e as f64)).collect();
        assert!((tail_move(&falling).unwrap() - 0.008).abs() < 1e-12);
        let flat: Vec<(u64, f64)> = (0..=20)
            .map(|e| {
                (
                    e,
                    if e < 15 {
                        0.01 * e as f64
                    } else {
                        0.3 + 0.001 * (e % 2) as f64
                    },
                )
            })
            .collect();
        // Epochs 16–20 move by 0.001: converged.
        assert!(tail_move(&flat).unwrap() < TOLERANCE);
        assert_eq!(tail_move(&[(0, 0.1)]), None);
        assert_eq!(tail_move(&[(3, 0.1), (3, 0.2)]), None);
    }

    #[test]
    fn jitter_is_not_a_move_but_drift_under_it_is() {
        // Epochs 80–100: a flat level with ±1 point of jitter (a max − min of 2 points) is read
        // as no move; the same jitter on a line rising 1 point over the tail reads as 1 point.
        let jitter = |e: u64| 0.01 * [1.0, -1.0, 0.0, 1.0, -1.0][(e % 5) as usize];
        let flat: Vec<(u64, f64)> = (0..=100).map(|e| (e, 0.4 + jitter(e))).collect();
        let rising: Vec<(u64, f64)> = (0..=100)
            .map(|e| (e, 0.4 + 0.0005 * e as f64 + jitter(e)))
            .collect();
        let flat_move = tail_move(&flat).unwrap();
        let rising_move = tail_move(&rising).unwrap();
        assert!(flat_move < TOLERANCE, "{flat_move}");
        // The jitter's own fitted slope shifts the reading, by the same amount in both.
        assert!(
            (rising_move - flat_move - 0.01).abs() < 1e-12,
            "{rising_move} {flat_move}"
        );
    }

    #[test]
    fn on_flat_noisy_curves_the_fitted_rise_stays_inside_the_tolerance_where_the_range_does_not() {
        // The module documentation's numbers: 8 seeds of per-evaluation noise with s.d. 0.54
        // point around a flat level, averaged; tails of 5 and 20 evaluations.
        use rand::SeedableRng;
        use rand_distr::{Distribution, Normal};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let noise = Normal::new(0.0, 0.0054).unwrap();
        let trials = 2000;
        for (epochs, range_fails_at_least, range_fails_at_most) in
            [(24u64, 0.25, 0.45), (96, 0.9, 1.0)]
        {
            let (mut range_fails, mut fit_fails) = (0usize, 0usize);
            for _ in 0..trials {
                let curve: Vec<(u64, f64)> = (0..=epochs)
                    .map(|e| {
                        let mean = (0..8).map(|_| noise.sample(&mut rng)).sum::<f64>() / 8.0;
                        (e, 0.4 + mean)
                    })
                    .collect();
                let from = epochs as f64 * (1.0 - TAIL);
                let tail: Vec<f64> = curve
                    .iter()
                    .filter(|p| p.0 as f64 >= from)
                    .map(|p| p.1)
                    .collect();
                let range = tail.iter().copied().fold(f64::MIN, f64::max)
                    - tail.iter().copied().fold(f64::MAX, f64::min);
                range_fails += usize::from(range >= TOLERANCE);
                fit_fails += usize::from(tail_move(&curve).unwrap() >= TOLERANCE);
            }
            let range_rate = range_fails as f64 / trials as f64;
            let fit_rate = fit_fails as f64 / trials as f64;
            assert!(
                (range_fails_at_least..=range_fails_at_most).contains(&range_rate),
                "{epochs} epochs: max − min fails {range_rate}"
            );
            assert!(
                fit_rate < 0.1,
                "{epochs} epochs: the fitted rise fails {fit_rate}"
            );
        }
    }

    #[test]
    fn the_mean_curve_keeps_the_epochs_every_curve_has() {
        let a = vec![(0, 0.1), (1, 0.2), (2, 0.3)];
        let b = vec![(0, 0.3), (2, 0.5)];
        let m = mean_curve(&[a.clone(), b]);
        assert_eq!(m.len(), 2);
        assert!((m[0].1 - 0.2).abs() < 1e-12 && (m[1].1 - 0.4).abs() < 1e-12);
        assert_eq!(mean_curve(std::slice::from_ref(&a)), a);
        assert!(mean_curve(&[]).is_empty());
        // Two runs jittering in opposite phase around a flat 0.3025 (each moves half a point over
        // its tail of two points) average to a flat curve: the row converged, neither run did.
        let up: Vec<(u64, f64)> = (0..=5).map(|e| (e, 0.3 + 0.005 * (e % 2) as f64)).collect();
        let down: Vec<(u64, f64)> = (0..=5)
            .map(|e| (e, 0.305 - 0.005 * (e % 2) as f64))
            .collect();
        assert!(tail_move(&up).unwrap() >= TOLERANCE);
        assert!(tail_move(&mean_curve(&[up, down])).unwrap() < 1e-12);
    }

    fn run(recipe: &str, curve: &[f64]) -> RunResult {
        RunResult {
            label: recipe.into(),
            recipe: recipe.into(),
            metrics: Vec::new(),
            log: curve
                .iter()
                .enumerate()
                .map(|(e, &value)| crate::train::LogRow {
                    epoch: e as u64,
                    step: 0,
                    split: "test".into(),
                    metric: "R@1".into(),
                    level: Some(0),
                    value,
                })
                .collect(),
            seconds: 0.0,
            test_queries: 0,
            seed: 0,
            device: "cpu".into(),
            code: String::new(),
        }
    }

    fn row(runs: Vec<RunResult>) -> super::super::table::TableRun {
        super::super::table::TableRun {
            table: "t".into(),
            method: "m".into(),
            setting: String::new(),
            runs,
        }
    }

    #[test]
    fn rows_outside_the_rule_are_named_with_the_sign_of_their_drift() {
        // Row m (batch=8) falls by 1 point over its tail, row m rises by 2; a converged row is
        // not listed.
        let mut falling = row(vec![run("f", &[0.1, 0.3, 0.32, 0.31, 0.30])]);
        falling.setting = "batch=8".into();
        let rising = row(vec![run("r", &[0.1, 0.2, 0.26, 0.28, 0.30])]);
        let flat = row(vec![run("c", &[0.1, 0.2, 0.30, 0.30, 0.30])]);
        let m = Measurements {
            runs: vec![falling, flat, rising],
            ..Measurements::default()
        };
        let text = describe(&m).unwrap();
        assert!(
            text.starts_with("Convergence: 1 of 3 rows converged"),
            "{text}"
        );
        assert!(
            text.ends_with("falling): m (batch=8) -1.0, m +2.0."),
            "{text}"
        );
        assert!((tail_drift(&[(0, 0.3), (1, 0.2)]).unwrap() + 0.1).abs() < 1e-12);
    }

    #[test]
    fn rows_converge_on_their_mean_curve_and_shared_rows_count_once() {
        // Six epochs, so the tail is epochs 5 and 6. Row a: two seeds jittering in opposite
        // phase (each moves 1 point over the tail, their mean is flat); row b: still rising by
        // 1 point; row a again (another table sharing its runs).
        let a = vec![
            run("a0", &[0.1, 0.2, 0.30, 0.31, 0.30, 0.31, 0.30]),
            run("a1", &[0.1, 0.2, 0.31, 0.30, 0.31, 0.30, 0.31]),
        ];
        let b = vec![run("b0", &[0.1, 0.2, 0.26, 0.27, 0.28, 0.29, 0.30])];
        let m = Measurements {
            runs: vec![row(a.clone()), row(b), row(a)],
            ..Measurements::default()
        };
        let text = describe(&m).unwrap();
        assert!(
            text.starts_with("Convergence: 1 of 2 rows converged"),
            "{text}"
        );
        assert!(text.contains("the largest move was 1.0 points"), "{text}");
        assert!(
            text.contains("0 of 3 single runs (largest 1.0 points"),
            "{text}"
        );
        assert!(text.contains("had not converged."), "{text}");
        // The row outside the rule is named, with the sign of its drift.
        assert!(text.ends_with("and falling): m +1.0."), "{text}");
        assert_eq!(describe(&Measurements::default()), None);
    }
}

//! Whether the runs behind a table had converged: a claim measured on still-rising curves says
//! something about the first epochs, not about the method.
//!
//! The criterion (issue #21's `standard` scale): over the last 20% of the epochs (at least the
//! last two evaluations), the test metric moves by less than half a point (0.005 as a
//! fraction). The metric is each run's test R@1 at the finest level, which every recipe
//! evaluates after each epoch; the embedded data has no separate validation split, so the test
//! curve stands in for the validation curve.

use super::runs::RunResult;
use super::table::Measurements;

/// The fraction of the epochs the criterion looks at.
pub const TAIL: f64 = 0.2;
/// The largest move (max − min, as a fraction) allowed over the tail.
pub const TOLERANCE: f64 = 0.005;

/// How far `curve` (`(epoch, value)`, in epoch order) moved over its last [`TAIL`] of epochs
/// (at least its last two points): `max − min` there; `None` with fewer than two points.
pub fn tail_move(curve: &[(u64, f64)]) -> Option<f64> {
    if curve.len() < 2 {
        return None;
    }
    let last = curve.last()?.0;
    let from = last as f64 - TAIL * last as f64;
    let mut tail: Vec<f64> = curve
        .iter()
        .filter(|(e, _)| *e as f64 >= from)
        .map(|p| p.1)
        .collect();
    if tail.len() < 2 {
        tail = curve[curve.len() - 2..].iter().map(|p| p.1).collect();
    }
    let max = tail.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = tail.iter().copied().fold(f64::INFINITY, f64::min);
    Some(max - min)
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
/// [`TOLERANCE`] over its last [`TAIL`] of epochs: the claims compare those means, and one
/// run's curve also jitters from epoch to epoch (a few tenths of a point of R@1 on the embedded
/// test set, as near-tied neighbours swap) where the mean over seeds shows the drift alone.
/// Single runs are counted too. Rows and runs that several tables share are counted once.
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
    for row in &m.runs {
        let Some(first) = row.runs.first() else {
            continue;
        };
        if seen_rows.contains(&first.recipe.as_str()) {
            continue;
        }
        seen_rows.push(&first.recipe);
        let curves: Vec<_> = row.runs.iter().map(|r| r.curve("R@1", Some(0))).collect();
        let Some(moved) = tail_move(&mean_curve(&curves)) else {
            continue;
        };
        rows += 1;
        if moved < TOLERANCE {
            rows_done += 1;
        }
        rows_worst = rows_worst.max(moved);
    }
    (total > 0).then(|| {
        format!(
            "Convergence: {rows_done} of {rows} rows converged (the mean over their seeds of the \
             test R@1 moved by less than 0.5 point over the last 20% of the epochs; the largest \
             move was {:.1} points), and {done} of {total} single runs (largest {:.1} points: one \
             run also jitters from epoch to epoch){}.",
            100.0 * rows_worst,
            100.0 * worst,
            if rows_done < rows {
                ": the verdicts describe training that had not converged"
            } else {
                ""
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
        // Two runs jittering in opposite phase around a flat 0.3 (each moves 1 point over its
        // tail) average to a flat curve: the row converged, neither run did.
        let up: Vec<(u64, f64)> = (0..=10)
            .map(|e| (e, 0.3 + 0.005 * (e % 2) as f64))
            .collect();
        let down: Vec<(u64, f64)> = (0..=10)
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
        assert!(text.ends_with("had not converged."), "{text}");
        assert_eq!(describe(&Measurements::default()), None);
    }
}

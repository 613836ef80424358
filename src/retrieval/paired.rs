//! Two evaluations of the same queries compared query by query: is model A's metric higher
//! than model B's beyond what the choice of test queries explains?
//!
//! Every metric of [`super::EvalReport`] is a mean over its counted queries, and both reports
//! keep each query's value ([`super::EvalReport::per_query`]). With the same queries and labels,
//! each query gives one difference `d_q = a_q − b_q` (the queries a metric skips — no positive
//! — are the same on both sides and left out), and the paired t-test of `mean(d) = 0` over them
//! (`n − 1` degrees of freedom) removes each query's own difficulty from the noise, as the
//! claims' tests do over SSR's shared queries and episodes ([`crate::stats::compare`],
//! [`crate::stats::Test::PairedUnits`]).
//!
//! What it does **not** cover: the noise of training. Two trainings of one recipe with two
//! seeds differ too; a verdict that generalises over seeds needs several of them on each side
//! (what `rankwise reproduce` does for the papers' claims). A significant difference here says
//! that *these two models* rank *this population of queries* differently.

use super::EvalReport;
use crate::error::{Error, Result};
use crate::stats::{paired_t, ALPHA};

/// One metric of two evaluations, compared query by query.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedDifference {
    /// The metric's name (as in [`super::MetricRow::metric`]).
    pub metric: String,
    /// Its label level (as in [`super::MetricRow::level`]).
    pub level: Option<usize>,
    /// The metric of the first evaluation (A).
    pub a: f64,
    /// The metric of the second evaluation (B).
    pub b: f64,
    /// `mean(d)`, `d_q = a_q − b_q` over the queries both count (`a − b` when they count the
    /// same queries, as with the same labels).
    pub difference: f64,
    /// The 95% interval of `mean(d)`: `mean(d) ± t_{0.975, n−1} · sd(d) / √n` (NaN with fewer
    /// than two queries; the point itself when every difference is the same).
    pub interval: (f64, f64),
    /// The two-sided p-value of the paired t-test (1 with fewer than two queries; 0 or 1 when
    /// every difference is the same: certain, or none).
    pub p: f64,
    /// The queries compared (those both evaluations count).
    pub queries: usize,
}

impl PairedDifference {
    /// Whether A and B differ beyond the queries' noise: `p <` [`ALPHA`].
    pub fn significant(&self) -> bool {
        self.p < ALPHA
    }
}

/// Each metric of `a` against the same metric of `b`, query by query (see the module
/// documentation).
///
/// Errors unless both reports rank the same number of queries against the same number of
/// references and report the same metrics in the same order (same options).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::retrieval::{evaluate, paired_differences, EvalOptions};
/// use rankwise::Labels;
///
/// let labels = Labels::from_fine(&[0, 0, 1, 1, 2, 2])?;
/// let opts = EvalOptions { recall_ks: vec![1], progress: false, ..EvalOptions::default() };
/// // A separates the classes; B puts every item at the same place.
/// let a = Tensor::new(&[[1.0f32, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [-1.0, 0.0], [-0.9, -0.1]], &Device::Cpu)?;
/// let b = Tensor::ones((6, 2), candle_core::DType::F32, &Device::Cpu)?;
/// let ra = evaluate(&a, &labels, None, &opts)?;
/// let rb = evaluate(&b, &labels, None, &opts)?;
/// let rows = paired_differences(&ra, &rb)?;
/// let r1 = rows.iter().find(|r| r.metric == "R@1").unwrap();
/// assert_eq!(r1.a, 1.0);
/// assert!(r1.difference > 0.0 && r1.queries == 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn paired_differences(a: &EvalReport, b: &EvalReport) -> Result<Vec<PairedDifference>> {
    if (a.num_queries, a.num_references) != (b.num_queries, b.num_references) {
        return Err(Error::invalid(
            "versus",
            format!(
                "the two evaluations rank {} queries against {} references and {} against {}: \
                 a paired comparison needs the same queries",
                a.num_queries, a.num_references, b.num_queries, b.num_references
            ),
        ));
    }
    let names = |r: &EvalReport| -> Vec<(String, Option<usize>)> {
        r.rows.iter().map(|m| (m.metric.clone(), m.level)).collect()
    };
    if names(a) != names(b) {
        return Err(Error::invalid(
            "versus",
            "the two evaluations report different metrics: evaluate both with the same options",
        ));
    }
    let (nq, m) = (a.num_queries, a.rows.len());
    if a.per_query.len() != nq * m || b.per_query.len() != nq * m {
        return Err(Error::Shape(format!(
            "per-query values: {} and {}, expected {nq} queries × {m} metrics",
            a.per_query.len(),
            b.per_query.len()
        )));
    }
    Ok(a.rows
        .iter()
        .zip(&b.rows)
        .enumerate()
        .map(|(s, (ra, rb))| {
            let d: Vec<f64> = (0..nq)
                .map(|q| (a.per_query[q * m + s], b.per_query[q * m + s]))
                .filter(|(x, y)| !x.is_nan() && !y.is_nan())
                .map(|(x, y)| x - y)
                .collect();
            let t = paired_t(&d);
            PairedDifference {
                metric: ra.metric.clone(),
                level: ra.level,
                a: ra.value,
                b: rb.value,
                difference: t.mean,
                interval: t.interval,
                p: t.p,
                queries: t.n,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retrieval::MetricRow;

    /// A report of `values` (one per query, NaN = skipped) for one metric.
    fn report(values: &[f64]) -> EvalReport {
        let counted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        EvalReport {
            num_queries: values.len(),
            num_references: values.len() - 1,
            rows: vec![MetricRow {
                metric: "R@1".into(),
                level: Some(0),
                value: counted.iter().sum::<f64>() / counted.len() as f64,
                queries: counted.len(),
                skipped: values.len() - counted.len(),
            }],
            per_query: values.to_vec(),
        }
    }

    #[test]
    fn hand_worked_paired_t_test() {
        // d = (1, 0, 1, 0, 1) over the five queries both count (the sixth is skipped):
        // mean 0.6, sd √0.3, se √0.06, t = 0.6/√0.06 = 2.449 with 4 df: p = 0.0705 (Student's
        // table: t_{0.95, 4} = 2.132, t_{0.975, 4} = 2.776), interval 0.6 ± 2.776 · √0.06.
        let a = report(&[1.0, 1.0, 1.0, 0.0, 1.0, f64::NAN]);
        let b = report(&[0.0, 1.0, 0.0, 0.0, 0.0, f64::NAN]);
        let [r] = paired_differences(&a, &b).unwrap().try_into().unwrap();
        assert_eq!((r.metric.as_str(), r.level, r.queries), ("R@1", Some(0), 5));
        assert_eq!((r.a, r.b), (0.8, 0.2));
        assert!((r.difference - 0.6).abs() < 1e-12);
        assert!((r.p - 0.0705).abs() < 5e-4, "{}", r.p);
        assert!(!r.significant());
        let half = 2.776445 * 0.06f64.sqrt();
        assert!(
            (r.interval.0 - (0.6 - half)).abs() < 1e-5,
            "{:?}",
            r.interval
        );
        assert!(
            (r.interval.1 - (0.6 + half)).abs() < 1e-5,
            "{:?}",
            r.interval
        );
        // Twice the queries, the same differences: t = 3.67 with 9 df, p = 0.0052.
        let a = report(&[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]);
        let b = report(&[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        let [r] = paired_differences(&a, &b).unwrap().try_into().unwrap();
        assert!((r.p - 0.0052).abs() < 2e-4, "{}", r.p);
        assert!(r.significant());
    }

    #[test]
    fn degenerate_differences_and_mismatched_reports() {
        // The same values: no difference, p = 1; a constant shift: certain.
        let a = report(&[0.5, 0.25, 1.0]);
        let [same] = paired_differences(&a, &a).unwrap().try_into().unwrap();
        assert_eq!(
            (same.difference, same.p, same.interval),
            (0.0, 1.0, (0.0, 0.0))
        );
        let shifted = report(&[0.25, 0.0, 0.75]);
        let [r] = paired_differences(&a, &shifted)
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!((r.difference, r.p), (0.25, 0.0));
        // One query: no test.
        let [one] = paired_differences(&report(&[1.0]), &report(&[0.0]))
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!((one.difference, one.p), (1.0, 1.0));
        assert!(one.interval.0.is_nan());
        // Other queries, other metrics: errors.
        let e = paired_differences(&a, &report(&[1.0, 0.0])).unwrap_err();
        assert!(e.to_string().contains("same queries"), "{e}");
        let mut other = a.clone();
        other.rows[0].metric = "R@2".into();
        let e = paired_differences(&a, &other).unwrap_err();
        assert!(e.to_string().contains("different metrics"), "{e}");
    }
}

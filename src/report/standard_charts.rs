//! The figures of the five papers' experiments as [`LineChart`]s, built from the library's own
//! types: training curves from a [`MetricsLog`], (hierarchical) precision–recall curves,
//! parameter sweeps with the paper's values beside ours, and few-shot accuracies with their 95%
//! intervals.

use super::comparison::ComparisonRow;
use super::figures::{IntervalStyle, LegendPosition, LineChart, Marker, Series, SeriesStyle};
use super::published::setting_value;
use crate::error::{Error, Result};
use crate::metrics::fewshot::AccuracyInterval;
use crate::train::MetricsLog;

/// One curve of a training-curves chart: the `(split, metric, level)` of the log, and its
/// legend entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCurve {
    /// `train` or the evaluated split (`test`).
    pub split: String,
    /// Logged metric name (`loss_mean`, `R@1`, `H-AP`, …).
    pub metric: String,
    /// Label level of a binary retrieval metric, `None` otherwise.
    pub level: Option<usize>,
    /// Legend entry.
    pub label: String,
}

impl LogCurve {
    /// The curve of `split`/`metric`/`level`, labelled `label`.
    pub fn new(split: &str, metric: &str, level: Option<usize>, label: &str) -> Self {
        LogCurve {
            split: split.into(),
            metric: metric.into(),
            level,
            label: label.into(),
        }
    }
}

/// Training curves: each requested curve of `log` against the epoch, as a line with markers.
///
/// Errors when a curve has no row in the log (naming it), so that a misspelt metric does not
/// give an empty figure. Curves on one chart share the y axis: put losses and retrieval metrics
/// on separate charts.
pub fn training_curves(
    log: &MetricsLog,
    title: &str,
    y_label: &str,
    curves: &[LogCurve],
) -> Result<LineChart> {
    let mut series = Vec::with_capacity(curves.len());
    for c in curves {
        let points: Vec<(f64, f64)> = log
            .series(&c.split, &c.metric, c.level)
            .into_iter()
            .map(|(epoch, v)| (epoch as f64, v))
            .collect();
        if points.is_empty() {
            return Err(Error::invalid(
                "training curve",
                format!(
                    "the log has no {}/{} (level {:?}) row",
                    c.split, c.metric, c.level
                ),
            ));
        }
        series.push(
            Series::line(c.label.clone(), points)
                .styled(SeriesStyle::LineAndMarkers(Marker::Circle)),
        );
    }
    Ok(LineChart::new(title, "epoch", y_label, series))
}

/// Precision–recall curves (one per named curve) on the unit square, legend lower left.
///
/// `hierarchical` labels the axes with HAPPIER's H-recall (Eq. 9) and H-precision (Eq. 10), for
/// curves from [`crate::metrics::hierarchical_pr_curve`]; otherwise recall and precision, for
/// [`crate::metrics::precision_recall_curve`] or
/// [`crate::metrics::pr_curve::mean_interpolated_precision`].
pub fn precision_recall(
    title: &str,
    curves: Vec<(String, Vec<(f64, f64)>)>,
    hierarchical: bool,
) -> LineChart {
    let series = curves
        .into_iter()
        .map(|(name, points)| Series::line(name, points))
        .collect();
    let (x, y) = if hierarchical {
        ("H-recall (HAPPIER Eq. 9)", "H-precision (HAPPIER Eq. 10)")
    } else {
        ("recall", "precision")
    };
    let mut chart = LineChart::new(title, x, y, series);
    chart.x_range = Some((0.0, 1.0));
    chart.y_range = Some((0.0, 1.02));
    chart.legend = LegendPosition::LowerLeft;
    chart
}

/// One swept quantity: the paper's values (markers) and ours (a line, with error bars when
/// ours are means over seeds), in one colour.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sweep {
    /// Legend stem, e.g. `SOP R@1`; the entries read `… (paper)` and `… (ours)`.
    pub name: String,
    /// `(parameter, value)` printed by the paper; may be empty (nothing printed).
    pub paper: Vec<(f64, f64)>,
    /// `(parameter, value)` we measured; may be empty (not run yet).
    pub ours: Vec<(f64, f64)>,
    /// The 95% half-width of each of `ours` (empty: single runs, no bars).
    pub ours_ci: Vec<f64>,
}

impl Sweep {
    /// The sweep over setting `key` (e.g. `batch`, `tau`, `alpha`) of comparison rows: each row
    /// whose setting holds `key` gives a paper point and/or an our point at that parameter
    /// value, sorted by parameter; ours carry error bars when every one of them has an
    /// interval (a mean over seeds).
    ///
    /// Errors when a value of `key` is not a number (naming the row).
    pub fn from_rows<'a>(
        name: impl Into<String>,
        rows: impl IntoIterator<Item = &'a ComparisonRow>,
        key: &str,
    ) -> Result<Self> {
        let mut paper = Vec::new();
        let mut ours = Vec::new();
        let mut ci = Vec::new();
        for r in rows {
            let Some(v) = setting_value(&r.setting, key) else {
                continue;
            };
            let x: f64 = v.parse().map_err(|_| {
                Error::invalid(
                    "sweep",
                    format!(
                        "{} / {} / {}: {key}={v} is not a number",
                        r.table, r.method, r.metric
                    ),
                )
            })?;
            if let Some(p) = r.paper {
                paper.push((x, p));
            }
            if let Some(o) = r.ours {
                ours.push((x, o));
                ci.push(r.ours_ci95);
            }
        }
        let by_x = |a: &(f64, f64), b: &(f64, f64)| a.0.total_cmp(&b.0);
        paper.sort_by(by_x);
        let mut order: Vec<usize> = (0..ours.len()).collect();
        order.sort_by(|&i, &j| by_x(&ours[i], &ours[j]));
        let ours_ci = if ci.iter().all(Option::is_some) {
            order.iter().filter_map(|&i| ci[i]).collect()
        } else {
            Vec::new()
        };
        Ok(Sweep {
            name: name.into(),
            paper,
            ours: order.iter().map(|&i| ours[i]).collect(),
            ours_ci,
        })
    }
}

/// A parameter sweep (HAPPIER Fig. 4 α and λ, Smooth-AP Table 5 τ/|P|/batch, FastAP's batch
/// size): for each sweep the paper's values as triangles and ours as a line with circles, both
/// in the sweep's colour.
///
/// Errors when no sweep has any point.
pub fn sweep(
    title: &str,
    parameter: &str,
    metric: &str,
    sweeps: &[Sweep],
    log_x: bool,
) -> Result<LineChart> {
    let mut series = Vec::new();
    for (i, s) in sweeps.iter().enumerate() {
        if !s.paper.is_empty() {
            series.push(
                Series::line(format!("{} (paper)", s.name), s.paper.clone())
                    .styled(SeriesStyle::Markers(Marker::Triangle))
                    .colored(i),
            );
        }
        if !s.ours.is_empty() {
            let mut ours = Series::line(format!("{} (ours)", s.name), s.ours.clone())
                .styled(SeriesStyle::LineAndMarkers(Marker::Circle))
                .colored(i);
            if s.ours_ci.len() == s.ours.len() {
                ours = ours.with_intervals(s.ours_ci.clone(), IntervalStyle::Bars);
            }
            series.push(ours);
        }
    }
    if series.is_empty() {
        return Err(Error::invalid(
            "sweep",
            format!("{title:?}: no paper value and no measured value to draw"),
        ));
    }
    let mut chart = LineChart::new(title, parameter, metric, series);
    chart.log_x = log_x;
    Ok(chart)
}

/// Few-shot accuracy with 95% intervals (SSR Table 2): one series per method of
/// `(x, mean ± half-width)` points (x = shots, episodes, …), drawn as lines with error bars.
pub fn accuracy_with_intervals(
    title: &str,
    x_label: &str,
    y_label: &str,
    methods: Vec<(String, Vec<(f64, AccuracyInterval)>)>,
) -> LineChart {
    let series = methods
        .into_iter()
        .map(|(name, points)| {
            let half: Vec<f64> = points.iter().map(|(_, a)| a.half_width).collect();
            let xy: Vec<(f64, f64)> = points.iter().map(|(x, a)| (*x, a.mean)).collect();
            Series::line(name, xy)
                .styled(SeriesStyle::LineAndMarkers(Marker::Circle))
                .with_intervals(half, IntervalStyle::Bars)
        })
        .collect();
    let mut chart = LineChart::new(title, x_label, y_label, series);
    chart.legend = LegendPosition::LowerRight;
    chart
}

//! Model selection on classes held out of the training split.
//!
//! The papers report the test metrics of their last epoch, or of the best one, and choose
//! their hyperparameters, on the test classes: a selection that flatters every method by its
//! luck on those classes (Musgrave et al., *A Metric Learning Reality Check*, ECCV 2020). With a
//! `[validation]` table, a run holds a fraction of the training split's fine classes out of
//! training — out of the sampler, the loss's proxies and a pretraining stage alike — evaluates
//! them at every evaluation (logged under the split `val`: each held-out image a query against
//! the other held-out images), and [`select`] names the epoch with the best validation value.
//! The test metrics of *that* epoch are the run's selected result, reached without looking at
//! the test classes; the trainer also keeps that epoch's network (`best.safetensors`).
//!
//! ```toml
//! [validation]
//! fraction = 0.2    # of the training split's fine classes
//! seed = 0          # which classes: the same for every seed of a comparison
//! metric = "R@1"    # NAME or NAME:LEVEL (0 = finest), as `rankwise compare --metric`
//! patience = 5      # optional early stopping: evaluations without a better value
//! ```
//!
//! The held-out classes depend only on the training labels and `seed`, not on the run's seed,
//! so that runs compared seed by seed select on the same classes. In-memory images are
//! normalised with the statistics of the whole training split (pixel statistics carry no
//! label; the held-out classes take part, as they would for a model trained before the split).

use super::log::LogRow;
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::retrieval::{
    cutoff_k, split_metric_level, BINARY_METRICS, HIERARCHICAL_METRICS, METRIC_NAMES,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The split the validation metrics are logged under.
pub const VALIDATION_SPLIT: &str = "val";

/// The recipe's `[validation]` table (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidationConfig {
    /// Fraction of the training split's fine classes held out, in `(0, 1)`; rounded to a whole
    /// number of classes, at least 2 held out and 2 kept.
    pub fraction: f64,
    /// Seed of the choice of classes.
    pub seed: u64,
    /// The metric that selects the epoch: `NAME` or `NAME:LEVEL` (`R@1`, `mAP@R:1`, `H-AP`); a
    /// binary metric without a level is read at level 0 (the finest).
    pub metric: String,
    /// Early stopping: training stops once this many evaluations in a row have brought no
    /// better validation value than the selected one ([`patience_spent`]); `None` (the
    /// default) trains every epoch. At least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patience: Option<u64>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        ValidationConfig {
            fraction: 0.2,
            seed: 0,
            metric: "R@1".into(),
            patience: None,
        }
    }
}

impl ValidationConfig {
    /// `(name, level)` of the `metric` field: level 0 for a binary metric given
    /// without one, `None` for H-AP, ASI and NDCG (`ASI:LEVEL` is that column's binary ASI).
    /// Errors name `validation.metric`.
    pub fn metric(&self) -> Result<(String, Option<usize>)> {
        let bad = |why: String| Error::invalid("validation.metric", why);
        let (name, level) = split_metric_level(&self.metric).ok_or_else(|| {
            bad(format!(
                "`{}`: expected NAME or NAME:LEVEL with LEVEL a number (0 = finest)",
                self.metric
            ))
        })?;
        let per_column = BINARY_METRICS.contains(&name) || cutoff_k(name).is_some();
        match level {
            // ASI is both: without a level, the hierarchical one.
            None if HIERARCHICAL_METRICS.contains(&name) => Ok((name.to_string(), None)),
            None => Ok((name.to_string(), Some(0))),
            Some(_) if !per_column && HIERARCHICAL_METRICS.contains(&name) => Err(bad(format!(
                "{name} is measured over all levels at once: give it without a level"
            ))),
            Some(level) => Ok((name.to_string(), Some(level))),
        }
    }

    /// Errors naming the field when the fraction is not in `(0, 1)` or the metric is not one
    /// that an evaluation with `recall_ks` measures.
    pub fn validate(&self, recall_ks: &[usize]) -> Result<()> {
        if !(self.fraction > 0.0 && self.fraction < 1.0) {
            return Err(Error::invalid(
                "validation.fraction",
                format!("must be in (0, 1), got {}", self.fraction),
            ));
        }
        if self.patience == Some(0) {
            return Err(Error::invalid(
                "validation.patience",
                "must be at least 1 (evaluations without a better validation value before \
                 training stops); leave it out to train every epoch",
            ));
        }
        let (name, _) = self.metric()?;
        if METRIC_NAMES.contains(&name.as_str()) {
            return Ok(());
        }
        match cutoff_k(&name) {
            None => Err(Error::invalid(
                "validation.metric",
                format!(
                    "`{name}` is not a metric; use one of {}, R@k or P@k",
                    METRIC_NAMES.join(", ")
                ),
            )),
            Some(k) if !recall_ks.contains(&k) => Err(Error::invalid(
                "validation.metric",
                format!("{name} is not measured: add {k} to eval.recall_ks"),
            )),
            Some(_) => Ok(()),
        }
    }
}

/// The fine classes of `labels` held out by `config`: `round(fraction × classes)` of them
/// (at least 2, leaving at least 2), drawn by a seeded shuffle of the sorted class ids. Errors
/// name `validation.fraction` when the training split has too few classes.
pub fn held_out_classes(labels: &Labels, config: &ValidationConfig) -> Result<BTreeSet<ClassId>> {
    let classes: BTreeSet<ClassId> = labels.column(0).into_iter().collect();
    let n = classes.len();
    let k = (config.fraction * n as f64).round() as usize;
    if n < 4 || k < 2 || k > n - 2 {
        return Err(Error::invalid(
            "validation.fraction",
            format!(
                "{} of the training split's {n} fine classes is {k}: at least 2 classes must be \
                 held out and 2 kept for training",
                config.fraction
            ),
        ));
    }
    let mut order: Vec<ClassId> = classes.into_iter().collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(config.seed));
    Ok(order.into_iter().take(k).collect())
}

/// `(kept, held_out)`: the indices of the images of `labels` whose fine class is not / is in
/// `classes`, each in increasing order.
pub fn split_indices(labels: &Labels, classes: &BTreeSet<ClassId>) -> (Vec<usize>, Vec<usize>) {
    (0..labels.len()).partition(|&i| !classes.contains(&labels.fine(i)))
}

/// The epoch a run's validation chose, and its test metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// Epochs completed at the chosen evaluation (0 = the untrained network).
    pub epoch: u64,
    /// The selecting metric.
    pub metric: String,
    /// Its level (`None` for H-AP, ASI, NDCG).
    pub level: Option<usize>,
    /// Its validation value at that epoch, the best of the run.
    #[serde(with = "crate::io::json_f64")]
    pub value: f64,
    /// Every test metric logged at that epoch (every split but `train` and `val`).
    pub test_metrics: Vec<LogRow>,
}

impl Selection {
    /// The selected epoch's metrics of the protocol's first test set (the split the log records
    /// first after `val`: `test` for a single set), the set whose final metrics a run reports.
    pub fn first_test_set(&self) -> impl Iterator<Item = &LogRow> {
        let first = self.test_metrics.first().map(|r| r.split.as_str());
        self.test_metrics
            .iter()
            .filter(move |r| Some(r.split.as_str()) == first)
    }

    /// The selected epoch's value of a test metric (`split` `test` for the single test set).
    pub fn test(&self, split: &str, metric: &str, level: Option<usize>) -> Option<f64> {
        self.test_metrics
            .iter()
            .find(|r| r.split == split && r.metric == metric && r.level == level)
            .map(|r| r.value)
    }
}

/// The evaluation of a run's log (`rows`, [`MetricsLog::rows`](super::log::MetricsLog::rows)) with the highest validation value of `metric` at `level` (every
/// metric is better higher; NaN values never win; on a tie the earliest epoch, which trained
/// least), with the test metrics logged at the same epoch. `None` when the log has no such
/// validation value.
///
/// ```
/// use rankwise::train::validation::select;
/// use rankwise::train::MetricsLog;
/// let mut log = MetricsLog::default();
/// for (epoch, val, test) in [(1, 0.30, 0.20), (2, 0.35, 0.21), (3, 0.35, 0.24), (4, 0.33, 0.25)] {
///     log.push(epoch, 10 * epoch, "val", "R@1", Some(0), val);
///     log.push(epoch, 10 * epoch, "test", "R@1", Some(0), test);
/// }
/// let s = select(log.rows(), "R@1", Some(0)).unwrap();
/// // Epoch 2 ties epoch 3 on validation and trained less; the last epoch's test value (0.25)
/// // is not the selected one.
/// assert_eq!((s.epoch, s.value), (2, 0.35));
/// assert_eq!(s.test("test", "R@1", Some(0)), Some(0.21));
/// ```
pub fn select(rows: &[LogRow], metric: &str, level: Option<usize>) -> Option<Selection> {
    let best = rows
        .iter()
        .filter(|r| r.split == VALIDATION_SPLIT && r.metric == metric && r.level == level)
        .filter(|r| !r.value.is_nan())
        .fold(None::<&LogRow>, |best, r| match best {
            Some(b) if b.value >= r.value => Some(b),
            _ => Some(r),
        })?;
    // The evaluation at that point: the rows of the same epoch and step (a resumed run's log
    // has each evaluation once).
    let test_metrics = rows
        .iter()
        .filter(|r| r.epoch == best.epoch && r.step == best.step)
        .filter(|r| r.split != "train" && r.split != VALIDATION_SPLIT)
        .cloned()
        .collect();
    Some(Selection {
        epoch: best.epoch,
        metric: metric.to_string(),
        level,
        value: best.value,
        test_metrics,
    })
}

/// Whether early stopping ends a run whose log is `rows`: at least `patience` validation
/// evaluations of `metric` at `level` came after the one [`select`] chooses, none of them better.
/// Decided from the log alone, so a resumed run stops where one that never stopped does.
///
/// ```
/// use rankwise::train::validation::patience_spent;
/// use rankwise::train::MetricsLog;
/// let mut log = MetricsLog::default();
/// for (epoch, val) in [(1, 0.30), (2, 0.35), (3, 0.35), (4, 0.33)] {
///     log.push(epoch, 10 * epoch, "val", "R@1", Some(0), val);
/// }
/// // Epoch 2 is selected (epoch 3 only ties it); two evaluations have come since.
/// assert!(patience_spent(log.rows(), "R@1", Some(0), 2));
/// assert!(!patience_spent(log.rows(), "R@1", Some(0), 3));
/// ```
pub fn patience_spent(rows: &[LogRow], metric: &str, level: Option<usize>, patience: u64) -> bool {
    let Some(best) = select(rows, metric, level) else {
        return false;
    };
    let since = rows
        .iter()
        .filter(|r| r.split == VALIDATION_SPLIT && r.metric == metric && r.level == level)
        .filter(|r| r.epoch > best.epoch)
        .count() as u64;
    since >= patience
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::MetricsLog;

    fn labels(classes: usize, per_class: usize) -> Labels {
        let fine: Vec<ClassId> = (0..classes)
            .flat_map(|c| std::iter::repeat_n(c as ClassId, per_class))
            .collect();
        Labels::from_fine(&fine).unwrap()
    }

    #[test]
    fn held_out_classes_are_a_seeded_fraction_independent_of_the_run() {
        let l = labels(20, 3);
        let c = ValidationConfig::default();
        let a = held_out_classes(&l, &c).unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(a, held_out_classes(&l, &c).unwrap());
        let other = ValidationConfig {
            seed: 1,
            ..c.clone()
        };
        assert_ne!(a, held_out_classes(&l, &other).unwrap());
        let (kept, held) = split_indices(&l, &a);
        assert_eq!((kept.len(), held.len()), (48, 12));
        assert!(held.iter().all(|&i| a.contains(&l.fine(i))));
        assert!(kept.iter().all(|&i| !a.contains(&l.fine(i))));
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        // Too few classes on either side.
        for (classes, fraction) in [(20, 0.05), (20, 0.95), (3, 0.5)] {
            let c = ValidationConfig {
                fraction,
                ..ValidationConfig::default()
            };
            let e = held_out_classes(&labels(classes, 2), &c)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("validation.fraction") && e.contains("at least 2"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_metric_is_parsed_and_checked_against_the_evaluation() {
        let m = |s: &str| ValidationConfig {
            metric: s.into(),
            ..ValidationConfig::default()
        };
        assert_eq!(m("R@1").metric().unwrap(), ("R@1".into(), Some(0)));
        assert_eq!(m("mAP@R:1").metric().unwrap(), ("mAP@R".into(), Some(1)));
        assert_eq!(m("H-AP").metric().unwrap(), ("H-AP".into(), None));
        assert!(m("H-AP:0").metric().is_err());
        assert_eq!(m("ASI").metric().unwrap(), ("ASI".into(), None));
        assert_eq!(m("ASI:1").metric().unwrap(), ("ASI".into(), Some(1)));
        assert!(m("R@1:x").metric().is_err());
        assert!(m("R@4").validate(&[1, 2, 4]).is_ok());
        assert!(m("NDCG").validate(&[1]).is_ok());
        let e = m("R@16").validate(&[1, 2, 4]).unwrap_err().to_string();
        assert!(
            e.contains("validation.metric") && e.contains("eval.recall_ks"),
            "{e}"
        );
        let e = m("accuracy").validate(&[1]).unwrap_err().to_string();
        assert!(e.contains("not a metric"), "{e}");
        for fraction in [0.0, 1.0, f64::NAN, -0.5] {
            let c = ValidationConfig {
                fraction,
                ..ValidationConfig::default()
            };
            assert!(c.validate(&[1]).is_err(), "{fraction}");
        }
    }

    #[test]
    fn patience_counts_the_evaluations_since_the_selected_one() {
        let mut log = MetricsLog::default();
        assert!(!patience_spent(log.rows(), "R@1", Some(0), 1));
        log.push(0, 0, "val", "R@1", Some(0), 0.2);
        assert!(!patience_spent(log.rows(), "R@1", Some(0), 1));
        // A NaN is an evaluation without a better value; another level or split is not one.
        log.push(1, 5, "val", "R@1", Some(0), f64::NAN);
        log.push(1, 5, "val", "R@1", Some(1), 0.9);
        log.push(1, 5, "test", "R@1", Some(0), 0.9);
        assert!(patience_spent(log.rows(), "R@1", Some(0), 1));
        assert!(!patience_spent(log.rows(), "R@1", Some(0), 2));
        // A new best restarts the count.
        log.push(2, 10, "val", "R@1", Some(0), 0.3);
        assert!(!patience_spent(log.rows(), "R@1", Some(0), 1));
        log.push(3, 15, "val", "R@1", Some(0), 0.1);
        log.push(4, 20, "val", "R@1", Some(0), 0.3);
        assert!(patience_spent(log.rows(), "R@1", Some(0), 2));
        let c = ValidationConfig {
            patience: Some(0),
            ..ValidationConfig::default()
        };
        let e = c.validate(&[1]).unwrap_err().to_string();
        assert!(e.contains("validation.patience"), "{e}");
    }

    #[test]
    fn select_takes_the_best_validation_value_and_that_evaluations_test_rows() {
        let mut log = MetricsLog::default();
        assert!(select(log.rows(), "R@1", Some(0)).is_none());
        log.push(0, 0, "val", "R@1", Some(0), 0.1);
        log.push(0, 0, "test", "R@1", Some(0), 0.05);
        log.push(1, 5, "train", "loss_mean", None, 0.9);
        log.push(1, 5, "val", "R@1", Some(0), f64::NAN);
        log.push(1, 5, "val", "R@1", Some(1), 0.9);
        log.push(1, 5, "test", "R@1", Some(0), 0.3);
        log.push(2, 10, "val", "R@1", Some(0), 0.4);
        log.push(2, 10, "test_small", "R@1", Some(0), 0.2);
        log.push(2, 10, "test", "mAP@R", Some(0), 0.1);
        let s = select(log.rows(), "R@1", Some(0)).unwrap();
        assert_eq!((s.epoch, s.value), (2, 0.4));
        assert_eq!(s.test_metrics.len(), 2);
        assert_eq!(s.test("test_small", "R@1", Some(0)), Some(0.2));
        assert_eq!(s.test("test", "R@1", Some(0)), None);
        // The other level, and a NaN never chosen over a number.
        assert_eq!(select(log.rows(), "R@1", Some(1)).unwrap().epoch, 1);
        let mut nan_only = MetricsLog::default();
        nan_only.push(1, 1, "val", "R@1", Some(0), f64::NAN);
        assert!(select(nan_only.rows(), "R@1", Some(0)).is_none());
        // A NaN before the best, a NaN after it.
        let mut log = MetricsLog::default();
        for (e, v) in [(1, f64::NAN), (2, 0.2), (3, f64::NAN), (4, 0.1)] {
            log.push(e, e, "val", "mAP", Some(0), v);
        }
        assert_eq!(select(log.rows(), "mAP", Some(0)).unwrap().epoch, 2);
    }
}

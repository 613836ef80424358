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
//! fraction = 0.2    # of the training split's fine classes (the default)
//! seed = 0          # which classes: the same for every seed of a comparison
//! metric = "R@1"    # NAME or NAME:LEVEL (0 = finest), as `rankwise compare --metric`
//! patience = 5      # optional early stopping: evaluations without a better value
//! ```
//!
//! **Folds** (`folds = K`, `fold = i` in place of `fraction`): the shuffled classes are cut into
//! `K` parts of near-equal size and run `i` holds part `i` out, so that the `K` runs of a
//! class-disjoint cross-validation (Musgrave et al.'s protocol, 4 folds) hold every training
//! class out exactly once. `rankwise tune` on a recipe that names `folds` but no `fold` trains
//! every fold itself ([`crate::experiments::tune`]); a single run must name its fold.
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

/// The fraction of the training classes held out when neither `fraction` nor `folds` is given.
pub const DEFAULT_FRACTION: f64 = 0.2;

/// The recipe's `[validation]` table (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidationConfig {
    /// Fraction of the training split's fine classes held out, in `(0, 1)`; rounded to a whole
    /// number of classes, at least 2 held out and 2 kept. `None`: [`DEFAULT_FRACTION`], or
    /// `1 / folds` with `folds`. Not given with `folds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Seed of the choice of classes (and of the folds' partition).
    pub seed: u64,
    /// The metric that selects the epoch: `NAME` or `NAME:LEVEL` (`R@1`, `mAP@R:1`, `H-AP`); a
    /// binary metric without a level is read at level 0 (the finest).
    pub metric: String,
    /// Early stopping: training stops once this many evaluations in a row have brought no
    /// better validation value than the selected one ([`patience_spent`]); `None` (the
    /// default) trains every epoch. At least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patience: Option<u64>,
    /// Class-disjoint cross-validation: the classes cut into this many parts (at least 2), one
    /// of which, [`ValidationConfig::fold`], is held out ([`held_out_classes`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folds: Option<u64>,
    /// With `folds`: the part this run holds out, `0..folds`. Needed to train; left out, the
    /// recipe stands for all of its folds (what `rankwise tune` cross-validates over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fold: Option<u64>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        ValidationConfig {
            fraction: None,
            seed: 0,
            metric: "R@1".into(),
            patience: None,
            folds: None,
            fold: None,
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

    /// The fraction of the classes held out: `fraction`, else `1 / folds`, else
    /// [`DEFAULT_FRACTION`] (nominal: rounded to whole classes by [`held_out_classes`]).
    pub fn held_out_fraction(&self) -> f64 {
        match (self.fraction, self.folds) {
            (Some(f), _) => f,
            (None, Some(k)) => 1.0 / k as f64,
            (None, None) => DEFAULT_FRACTION,
        }
    }

    /// The folds a search cross-validates over: `folds` when the recipe names no `fold`, else 1
    /// (a single split: the fraction's, or the named fold).
    pub fn cross_validation_folds(&self) -> usize {
        match (self.folds, self.fold) {
            (Some(k), None) => k as usize,
            _ => 1,
        }
    }

    /// What a single run needs: with `folds`, the `fold` it holds out. The error names
    /// `validation.fold`.
    pub fn check_fold(&self) -> Result<()> {
        match (self.folds, self.fold) {
            (Some(folds), None) => Err(Error::invalid(
                "validation.fold",
                format!(
                    "with validation.folds = {folds}, name the fold this run holds out (0 to \
                     {}); `rankwise tune` trains every fold itself",
                    folds.saturating_sub(1)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// This table holding out fold `fold` (of `folds`).
    pub fn with_fold(&self, fold: u64) -> ValidationConfig {
        ValidationConfig {
            fold: Some(fold),
            ..self.clone()
        }
    }

    /// The same held-out classes and selecting metric, whatever spelling: the fraction made
    /// explicit and the patience left out (a resumed run may change its patience, not these).
    pub fn held_out_key(&self) -> ValidationConfig {
        ValidationConfig {
            fraction: self.folds.is_none().then(|| self.held_out_fraction()),
            patience: None,
            ..self.clone()
        }
    }

    /// The held-out classes in words: `20% of the training split's classes`, `fold 2 of 4 of
    /// the training split's classes`, or, for a recipe that stands for all its folds,
    /// `each of 4 folds of the training split's classes`.
    pub fn describe(&self) -> String {
        match (self.folds, self.fold) {
            (Some(k), Some(f)) => format!("fold {f} of {k} of the training split's classes"),
            (Some(k), None) => format!("each of {k} folds of the training split's classes"),
            _ => format!(
                "{:.0}% of the training split's classes",
                100.0 * self.held_out_fraction()
            ),
        }
    }

    /// Errors naming the field when the fraction is not in `(0, 1)` or the metric is not one
    /// that an evaluation with `recall_ks` measures.
    pub fn validate(&self, recall_ks: &[usize]) -> Result<()> {
        if let Some(fraction) = self.fraction {
            if !(fraction > 0.0 && fraction < 1.0) {
                return Err(Error::invalid(
                    "validation.fraction",
                    format!("must be in (0, 1), got {fraction}"),
                ));
            }
            if let Some(folds) = self.folds {
                return Err(Error::invalid(
                    "validation.fraction",
                    format!(
                        "give either a fraction or folds, not both: {folds} folds hold out \
                         1/{folds} of the classes each"
                    ),
                ));
            }
        }
        match (self.folds, self.fold) {
            (Some(folds), _) if folds < 2 => {
                return Err(Error::invalid(
                    "validation.folds",
                    format!("must be at least 2, got {folds}"),
                ))
            }
            (Some(folds), Some(fold)) if fold >= folds => {
                return Err(Error::invalid(
                    "validation.fold",
                    format!(
                        "{fold} is not one of the {folds} folds (0 to {})",
                        folds - 1
                    ),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "validation.fold",
                    "a fold needs validation.folds, the number of parts the classes are cut into",
                ))
            }
            _ => {}
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

/// The fine classes of `labels` held out by `config`, drawn by a seeded shuffle of the sorted
/// class ids: the first `round(fraction × classes)` of them (at least 2, leaving at least 2),
/// or with `folds = K` the shuffled ids cut into `K` consecutive parts of `⌊n/K⌋` or `⌈n/K⌉`
/// classes and part `fold` of them, so that the `K` folds of one seed partition the classes.
/// Errors name `validation.fraction` or `validation.folds` when the training split has too few
/// classes (for folds: when any fold would hold out fewer than 2), and `validation.fold` when
/// a recipe with folds names none.
///
/// ```
/// use rankwise::hierarchy::Labels;
/// use rankwise::train::validation::held_out_classes;
/// use rankwise::train::ValidationConfig;
/// let labels = Labels::from_fine(&(0..10).flat_map(|c| [c, c]).collect::<Vec<_>>())?;
/// let fold = |f| ValidationConfig { folds: Some(4), fold: Some(f), ..Default::default() };
/// let parts: Vec<_> = (0..4).map(|f| held_out_classes(&labels, &fold(f))).collect::<Result<_, _>>()?;
/// // 10 classes in 4 folds of 2 or 3, every class held out by exactly one of them.
/// assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [2, 3, 2, 3]);
/// let all: std::collections::BTreeSet<_> = parts.iter().flatten().copied().collect();
/// assert_eq!(all.len(), 10);
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn held_out_classes(labels: &Labels, config: &ValidationConfig) -> Result<BTreeSet<ClassId>> {
    let classes: BTreeSet<ClassId> = labels.column(0).into_iter().collect();
    let n = classes.len();
    let (start, end) = match config.folds {
        None => {
            let fraction = config.held_out_fraction();
            let k = (fraction * n as f64).round() as usize;
            if n < 4 || k < 2 || k > n - 2 {
                return Err(Error::invalid(
                    "validation.fraction",
                    format!(
                        "{fraction} of the training split's {n} fine classes is {k}: at least 2 \
                         classes must be held out and 2 kept for training"
                    ),
                ));
            }
            (0, k)
        }
        Some(folds) => {
            let k = folds as usize;
            // The smallest fold holds ⌊n/K⌋ out, the largest keeps n − ⌈n/K⌉.
            if n / k < 2 || n - n.div_ceil(k) < 2 {
                return Err(Error::invalid(
                    "validation.folds",
                    format!(
                        "{folds} folds of the training split's {n} fine classes: every fold must \
                         hold out at least 2 classes and keep 2 for training (at most {} folds)",
                        n / 2
                    ),
                ));
            }
            config.check_fold()?;
            let fold = config.fold.unwrap_or(0) as usize;
            (fold * n / k, (fold + 1) * n / k)
        }
    };
    let mut order: Vec<ClassId> = classes.into_iter().collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(config.seed));
    Ok(order[start..end].iter().copied().collect())
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
                fraction: Some(fraction),
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
    fn folds_partition_the_classes_and_each_run_names_its_fold() {
        let l = labels(23, 2);
        let cv = |fold| ValidationConfig {
            folds: Some(4),
            fold,
            ..ValidationConfig::default()
        };
        let parts: Vec<BTreeSet<ClassId>> = (0..4)
            .map(|f| held_out_classes(&l, &cv(Some(f))).unwrap())
            .collect();
        let sizes: Vec<usize> = parts.iter().map(BTreeSet::len).collect();
        assert_eq!(sizes, [5, 6, 6, 6]);
        let all: BTreeSet<ClassId> = parts.iter().flatten().copied().collect();
        assert_eq!(all.len(), 23, "every class held out by exactly one fold");
        // The seed reshuffles the partition; the same seed gives the same one.
        assert_eq!(parts[2], held_out_classes(&l, &cv(Some(2))).unwrap());
        let reseeded = ValidationConfig {
            seed: 7,
            ..cv(Some(2))
        };
        assert_ne!(parts[2], held_out_classes(&l, &reseeded).unwrap());
        // Fold 0 of 5 is not the 20% split: another cut of the same shuffle (its first ⌊n/5⌋).
        let fifth = ValidationConfig {
            folds: Some(5),
            fold: Some(0),
            ..ValidationConfig::default()
        };
        let plain = held_out_classes(&l, &ValidationConfig::default()).unwrap();
        let f0 = held_out_classes(&l, &fifth).unwrap();
        assert_eq!((plain.len(), f0.len()), (5, 4));
        assert!(f0.is_subset(&plain));
        // A run must name its fold; too many folds for the classes.
        let e = held_out_classes(&l, &cv(None)).unwrap_err().to_string();
        assert!(e.contains("validation.fold") && e.contains("0 to 3"), "{e}");
        let many = ValidationConfig {
            folds: Some(12),
            fold: Some(0),
            ..ValidationConfig::default()
        };
        let e = held_out_classes(&l, &many).unwrap_err().to_string();
        assert!(
            e.contains("validation.folds") && e.contains("at most 11"),
            "{e}"
        );
    }

    #[test]
    fn fraction_folds_and_fold_are_checked_together() {
        let v = |fraction, folds, fold| ValidationConfig {
            fraction,
            folds,
            fold,
            ..ValidationConfig::default()
        };
        assert!(v(None, Some(4), None).validate(&[1]).is_ok());
        assert!(v(None, Some(4), Some(3)).validate(&[1]).is_ok());
        for (c, field, want) in [
            (
                v(Some(0.2), Some(4), None),
                "validation.fraction",
                "not both",
            ),
            (v(Some(1.0), None, None), "validation.fraction", "(0, 1)"),
            (v(None, Some(1), None), "validation.folds", "at least 2"),
            (v(None, Some(4), Some(4)), "validation.fold", "0 to 3"),
            (
                v(None, None, Some(0)),
                "validation.fold",
                "needs validation.folds",
            ),
        ] {
            let e = c.validate(&[1]).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(want), "{c:?}: {e}");
        }
        assert_eq!(v(None, None, None).held_out_fraction(), DEFAULT_FRACTION);
        assert_eq!(v(None, Some(4), None).held_out_fraction(), 0.25);
        assert_eq!(v(None, Some(4), None).cross_validation_folds(), 4);
        assert_eq!(v(None, Some(4), Some(1)).cross_validation_folds(), 1);
        assert_eq!(v(Some(0.3), None, None).cross_validation_folds(), 1);
        assert_eq!(
            v(None, Some(4), None).with_fold(2).describe(),
            "fold 2 of 4 of the training split's classes"
        );
        assert_eq!(
            v(None, None, None).describe(),
            "20% of the training split's classes"
        );
        // The default fraction and an explicit 0.2 hold the same classes out.
        assert_eq!(
            v(None, None, None).held_out_key(),
            v(Some(DEFAULT_FRACTION), None, None).held_out_key()
        );
        assert_ne!(
            v(None, Some(4), Some(0)).held_out_key(),
            v(None, Some(4), Some(1)).held_out_key()
        );
    }

    #[test]
    fn a_table_without_folds_serialises_as_before() {
        // Recipes written before folds existed (and their run cache keys) read back the same.
        let c: ValidationConfig = toml::from_str("fraction = 0.25\nseed = 3").unwrap();
        assert_eq!(c.fraction, Some(0.25));
        let text = toml::to_string(&c).unwrap();
        assert_eq!(text, "fraction = 0.25\nseed = 3\nmetric = \"R@1\"\n");
        let folds: ValidationConfig = toml::from_str("folds = 4\nfold = 1").unwrap();
        assert_eq!(
            (folds.folds, folds.fold, folds.fraction),
            (Some(4), Some(1), None)
        );
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
                fraction: Some(fraction),
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

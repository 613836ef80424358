//! Hyperparameters chosen on classes held out of training, never on the test classes
//! (`rankwise tune`).
//!
//! **Why.** The papers choose τ, the learning rate or the margin by their test metrics and then
//! report those same test metrics. The value reported is then the grid's luckiest on the test
//! classes, and the number carries that luck: Musgrave et al. (*A Metric Learning Reality Check*,
//! ECCV 2020) found most of a decade of losses' reported gains gone once every loss was tuned on
//! held-out training classes under one protocol. Here every point of a search (a grid of recipe
//! overrides, or points drawn at random from ranges: [`super::search`]) trains with the same
//! seeds, each run holding its `[validation]` classes out ([`crate::train::validation`]), and
//! the point with the best mean validation value is chosen, each run read at the epoch its
//! validation selected. The
//! chosen point's test metrics at those epochs are the honest result: neither the
//! hyperparameters nor the epochs saw the test classes.
//!
//! **What else a reader needs.** Two numbers say how much to trust the choice:
//! - *How sure it is*: every other point against the chosen one on the validation values, seed
//!   by seed (the paired t-test over the seeds, Holm-corrected over the other points, as
//!   [`super::compare`]). A point inside the noise could as well have been chosen with other
//!   seeds. This is descriptive: the chosen point is the largest of noisy means, so its lead is
//!   biased upwards; a point found lower is lower beyond doubt, one inside the noise is not
//!   shown worse.
//! - *What tuning on the test classes would have reported*: the point with the best mean test
//!   value of the validation's own metric (its epochs still chosen by validation), and its gap
//!   to the honest result, the optimism of choosing on the test classes.
//!
//! **Cross-validation.** One split of the classes is itself a draw: another 20% held out may
//! prefer another point. With `[validation] folds = K` (and no `fold`), every point trains once
//! per fold and seed, fold `i` holding the `i`-th of `K` class-disjoint parts out, so every
//! training class validates once (Musgrave et al. use 4 folds). A point's value for a seed is
//! the mean over its `K` fold runs, of the validation metric and of each test metric, and the
//! tests stay paired over the seeds: the seed is the replicate (it fixes the initial weights
//! and batches of every fold's run), the folds are the yardstick's fixed design, as SSR's
//! episodes are for [`crate::experiments::claim`].
//!
//! Musgrave et al. report two test results of the `K` fold models: *separated*, the mean of
//! their metrics (each model alone: [`Candidate::test`]), and *concatenated*, the metrics of the
//! `K` models as one, each test image's embeddings by the `K` models concatenated
//! ([`crate::retrieval::ensemble`]: [`Candidate::concatenated`]). Each fold run keeps its test
//! embeddings at the epoch its validation selected ([`Runner::selected_test_embeddings`]), so
//! the ensemble costs one evaluation per point and seed, no training; the reading says whether
//! the ensemble's gain over the separated mean is beyond the seeds' noise.
//!
//! ```text
//! rankwise tune --config configs/embedded_smooth_ap.toml --set validation.fraction=0.2 \
//!     --grid loss.tau=0.001,0.01,0.1 --seeds 3
//! rankwise tune --config configs/embedded_smooth_ap.toml --set validation.folds=4 \
//!     --grid loss.tau=0.01,0.1 --seeds 3
//! rankwise tune --config configs/embedded_smooth_ap.toml --set validation.fraction=0.2 \
//!     --sample 'loss.tau=loguniform(0.003,0.3)' --samples 8 --seeds 3
//! ```

use super::compare::{
    arm_values, check_metric_names, devices_of, resolve_metrics, run_arms, versus_baseline, Arm,
    ArmSpec, ArmValues, MetricChoice, Versus,
};
use super::runs::{RunResult, Runner};
pub use super::search::{grid, override_value, GridAxis, Search, SearchRange};
use crate::error::{Error, Result};
use crate::io::results::{csv_f64, write_json, ResultFormat};
use crate::io::write_atomically;
use crate::report::{IntervalStyle, LineChart, Marker, Series, SeriesStyle};
use crate::retrieval::ensemble::concatenate;
use crate::retrieval::EvalOptions;
use crate::stats::{format_p, paired_t, PairedT, Sample};
use crate::train::{Selection, ValidationConfig};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// The recipe of every point of `search`: `base` with the `shared` overrides, then the point's
/// own (labelled by them, `loss.tau=0.01, epochs=8`). Every point must hold classes out for
/// validation, all the same ones: an error says how to add a `[validation]` table.
pub fn candidates(base: &Path, shared: &[String], search: &Search) -> Result<Vec<Arm>> {
    let arms = search
        .points()?
        .into_iter()
        .map(|point| {
            ArmSpec {
                label: point.join(", "),
                recipe: None,
                overrides: point,
            }
            .resolve(base, shared)
        })
        .collect::<Result<Vec<Arm>>>()?;
    validation_of(&arms)?;
    Ok(arms)
}

/// The `[validation]` table every candidate shares.
fn validation_of(arms: &[Arm]) -> Result<ValidationConfig> {
    let first = arms.first().and_then(|a| a.config.validation.clone());
    let Some(validation) = first else {
        return Err(Error::invalid(
            "[validation]",
            "the recipe holds no classes out to choose on: add a [validation] table, or --set \
             validation.fraction=0.2 (or validation.folds=4 to cross-validate)",
        ));
    };
    if let Some(a) = arms
        .iter()
        .find(|a| a.config.validation.as_ref() != Some(&validation))
    {
        return Err(Error::invalid(
            "[validation]",
            format!(
                "point `{}` holds other classes out than `{}`: every point must be chosen on the \
                 same ones",
                a.label, arms[0].label
            ),
        ));
    }
    Ok(validation)
}

/// One point of a search: what it trained and measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The point's label (its overrides, joined by `, `).
    pub label: String,
    /// Its `KEY=VALUE` overrides.
    pub overrides: Vec<String>,
    /// Its resolved recipe (TOML, of the first run: the first seed and, with folds, fold 0).
    pub recipe: String,
    /// The validation value of each seed's selected epoch (`arm` = the label); with folds, each
    /// seed's mean over its fold runs.
    pub validation: ArmValues,
    /// With folds, each fold's validation values (`[fold][seed]`) that
    /// [`Candidate::validation`] averages; empty for a single split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fold_validation: Vec<Vec<f64>>,
    /// The epoch each run's validation selected: one per seed, or with folds fold by fold
    /// (`[fold × seeds + seed]`).
    pub selected_epochs: Vec<u64>,
    /// The test metrics at those epochs, one per [`Tuning::metrics`] entry (with folds, each
    /// seed's mean over its fold models: Musgrave et al.'s *separated* result).
    pub test: Vec<ArmValues>,
    /// With folds, the test metrics of each seed's fold models as one, their embeddings at the
    /// selected epochs concatenated ([`crate::retrieval::ensemble`]: Musgrave et al.'s
    /// *concatenated* result), one per [`Tuning::metrics`] entry; empty for a single split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concatenated: Vec<ArmValues>,
    /// The point against the chosen one on the validation values (`None` for the chosen point).
    pub versus_chosen: Option<Versus>,
}

impl Candidate {
    /// With folds, each fold's mean validation value over the seeds; empty for a single split.
    pub fn fold_means(&self) -> Vec<f64> {
        self.fold_validation
            .iter()
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
            .collect()
    }
}

/// A search on held-out training classes (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tuning {
    /// What was searched: a grid, or random points.
    pub search: Search,
    /// The seeds every point trained with.
    pub seeds: Vec<u64>,
    /// The run code of the build that trained the runs.
    pub run_code: String,
    /// The devices the runs trained on.
    pub devices: Vec<String>,
    /// The recipe's `[validation]` table: the classes held out and the metric that chooses.
    pub validation: ValidationConfig,
    /// The test metrics reported, `(name, level)`; the validation's metric among them.
    pub metrics: Vec<(String, Option<usize>)>,
    /// Every point, in the search's order.
    pub candidates: Vec<Candidate>,
    /// The point chosen on the held-out classes: the best mean validation value (the first in
    /// the search's order on a tie).
    pub chosen: usize,
    /// The index in [`Tuning::metrics`] of the validation's metric read on the test set.
    pub selection_metric: usize,
    /// The point the test set would have chosen: the best mean test value of that metric (the
    /// chosen point when it ties for the best; `None` when no point has a value).
    pub test_choice: Option<usize>,
    /// The test choice's mean test value minus the chosen point's: what choosing on the test
    /// classes would have added to the reported number.
    #[serde(with = "crate::io::json_f64")]
    pub optimism: f64,
}

/// Trains (or reads back through `runner`'s cache) every candidate ([`candidates`]: `arms[i]`
/// is the search's point `i`) with every seed and makes the choice of [`tune_runs`]. Everything
/// is checked before the first run trains.
pub fn tune(
    runner: &Runner,
    search: &Search,
    arms: &[Arm],
    seeds: &[u64],
    jobs: usize,
    metrics: &[MetricChoice],
) -> Result<Tuning> {
    let points = search.points()?;
    if points.len() != arms.len() {
        return Err(Error::Shape(format!(
            "{} recipes for the {} points of the search",
            arms.len(),
            points.len()
        )));
    }
    let validation = validation_of(arms)?;
    validation.metric()?;
    check_metric_names(metrics, arms)?;
    let folds = validation.cross_validation_folds();
    let runs = run_arms(runner, &fold_arms(arms, folds), seeds, jobs)?;
    // run_arms gives `[point × folds + fold][seed]`; tune_runs reads `[point][fold × seeds + seed]`.
    let runs: Vec<Vec<RunResult>> = runs.chunks(folds).map(<[_]>::concat).collect();
    let labels: Vec<String> = arms.iter().map(|a| a.label.clone()).collect();
    let mut tuning = tune_runs(search, &labels, seeds, &runs, metrics, &validation)?;
    tuning.run_code = runner.run_code().to_string();
    if folds > 1 {
        for ((candidate, point), arm) in tuning.candidates.iter_mut().zip(&runs).zip(arms) {
            // As the trainer evaluates a test set: its recall list, on the runs' device.
            let opts = EvalOptions {
                recall_ks: arm.config.eval.recall_ks.clone(),
                device: arm.config.device.device()?,
                ..EvalOptions::default()
            };
            candidate.concatenated = concatenated_values(
                runner,
                candidate,
                point,
                seeds.len(),
                &tuning.metrics,
                &opts,
            )?;
        }
    }
    Ok(tuning)
}

/// The test `metrics` of each seed's fold models of `candidate` as one (Musgrave et al.'s
/// concatenated embedding, [`concatenate`]), `point[f × seeds + s]` the run of fold `f` and seed
/// `s`: each run's test embeddings at the epoch its validation selected, kept by `runner`
/// ([`Runner::selected_test_embeddings`]), evaluated with `opts` as the trainer evaluates a test
/// set. An error names a run whose kept embeddings are of another epoch than the one selected.
fn concatenated_values(
    runner: &Runner,
    candidate: &Candidate,
    point: &[RunResult],
    seeds: usize,
    metrics: &[(String, Option<usize>)],
    opts: &EvalOptions,
) -> Result<Vec<ArmValues>> {
    let folds = point.len() / seeds;
    let mut values = vec![Vec::with_capacity(seeds); metrics.len()];
    for s in 0..seeds {
        let members = (0..folds)
            .map(|f| {
                let i = f * seeds + s;
                let (epoch, kept) = runner.selected_test_embeddings(&point[i])?;
                if epoch != candidate.selected_epochs[i] {
                    return Err(Error::invalid(
                        "run",
                        format!(
                            "`{}` kept the test embeddings of epoch {epoch}, but its validation \
                             selected epoch {}: delete its files from the cache to re-run it",
                            point[i].label, candidate.selected_epochs[i]
                        ),
                    ));
                }
                Ok(kept)
            })
            .collect::<Result<Vec<_>>>()?;
        let report = concatenate(&members)?.evaluate(opts)?;
        for ((m, l), v) in metrics.iter().zip(&mut values) {
            v.push(report.get(m, *l).ok_or_else(|| {
                Error::invalid(
                    "metric",
                    format!(
                        "the concatenated fold models of `{}` have no {m}",
                        candidate.label
                    ),
                )
            })?);
        }
    }
    Ok(values
        .into_iter()
        .map(|v| arm_values(&candidate.label, Sample::new(v)))
        .collect())
}

/// Each point's recipes, one per fold to cross-validate over (`folds` from
/// [`ValidationConfig::cross_validation_folds`]): point by point, fold by fold, each holding its
/// fold out and labelled `LABEL · fold i`; the points themselves for a single split.
pub fn fold_arms(arms: &[Arm], folds: usize) -> Vec<Arm> {
    if folds <= 1 {
        return arms.to_vec();
    }
    arms.iter()
        .flat_map(|arm| {
            (0..folds as u64).map(move |f| {
                let mut config = arm.config.clone();
                config.validation = config.validation.map(|v| v.with_fold(f));
                Arm {
                    label: format!("{} · fold {f}", arm.label),
                    config,
                }
            })
        })
        .collect()
}

/// The choice among finished runs, `runs[p][s]` the run of point `p` (labelled `labels[p]`,
/// the `p`-th of [`Search::points`]) with seed `seeds[s]` (with `validation`
/// cross-validating over `F` folds, `runs[p][f × seeds + s]` is that of fold `f`): each run read
/// at the epoch its validation selected ([`RunResult::selection`]; with folds, each seed's
/// values averaged over its fold runs), the point with the best mean validation value chosen
/// (the first on a tie; NaN never), every other point tested against it on the validation
/// values seed by seed (Holm-corrected), `metrics` read on the test set at the selected epochs
/// (the validation's metric added first when not named), and the point the test set would
/// have chosen. [`Tuning::run_code`] and each [`Candidate::concatenated`] are left empty
/// ([`tune`] fills them, the latter from the fold runs' kept test embeddings).
///
/// ```
/// use rankwise::experiments::tune::{tune_runs, Search};
/// use rankwise::experiments::{MetricValue, RunResult};
/// use rankwise::train::{MetricsLog, ValidationConfig};
/// // A run whose validation R@1 peaks at epoch 1 while its test R@1 still rises at epoch 2.
/// let run = |val: [f64; 2], test: [f64; 2]| {
///     let mut log = MetricsLog::default();
///     for e in 0..2 {
///         log.push(e as u64 + 1, 0, "val", "R@1", Some(0), val[e]);
///         log.push(e as u64 + 1, 0, "test", "R@1", Some(0), test[e]);
///     }
///     RunResult { label: String::new(), recipe: String::new(), log: log.rows().to_vec(),
///                 metrics: vec![MetricValue { metric: "R@1".into(), level: Some(0),
///                                             value: test[1] }],
///                 seconds: 0.0, test_queries: 10, seed: 0, device: "cpu".into(),
///                 code: String::new() }
/// };
/// let search = Search::Grid { axes: vec!["loss.tau=0.01,0.1".parse()?] };
/// let runs = vec![
///     vec![run([0.50, 0.48], [0.30, 0.33]), run([0.52, 0.50], [0.31, 0.35])],
///     vec![run([0.40, 0.45], [0.34, 0.36]), run([0.43, 0.47], [0.35, 0.37])],
/// ];
/// let t = tune_runs(&search, &["tau 0.01".into(), "tau 0.1".into()], &[0, 1], &runs, &[],
///                   &ValidationConfig::default())?;
/// // τ = 0.01 wins on validation (0.51 against 0.46); its test R@1 is read at epoch 1.
/// assert_eq!(t.chosen, 0);
/// assert_eq!(t.candidates[0].selected_epochs, [1, 1]);
/// assert!((t.candidates[0].test[0].mean - 0.305).abs() < 1e-12);
/// // The test set would have chosen τ = 0.1 (0.365 at its epoch 2): 0.06 of optimism.
/// assert_eq!(t.test_choice, Some(1));
/// assert!((t.optimism - 0.06).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn tune_runs(
    search: &Search,
    labels: &[String],
    seeds: &[u64],
    runs: &[Vec<RunResult>],
    metrics: &[MetricChoice],
    validation: &ValidationConfig,
) -> Result<Tuning> {
    let points = search.points()?;
    let folds = validation.cross_validation_folds();
    let per_point = folds * seeds.len();
    if runs.len() != points.len()
        || labels.len() != points.len()
        || runs.iter().any(|r| r.len() != per_point)
    {
        return Err(Error::Shape(format!(
            "{} points of runs and {} labels for a search of {} points, each needing {} seeds × \
             {folds} fold(s)",
            runs.len(),
            labels.len(),
            points.len(),
            seeds.len()
        )));
    }
    // Each seed's value over its folds: the mean of `value(run)` over runs f × S + s.
    let per_seed = |value: &dyn Fn(usize) -> Result<f64>| -> Result<Vec<f64>> {
        (0..seeds.len())
            .map(|s| {
                let mut sum = 0.0;
                for f in 0..folds {
                    sum += value(f * seeds.len() + s)?;
                }
                Ok(sum / folds as f64)
            })
            .collect()
    };
    let selections: Vec<Vec<Selection>> = runs
        .iter()
        .map(|point| point.iter().map(|r| r.selection(validation)).collect())
        .collect::<Result<_>>()?;
    let read: Vec<Vec<RunResult>> = runs
        .iter()
        .zip(&selections)
        .map(|(point, s)| {
            point
                .iter()
                .zip(s)
                .map(|(r, s)| r.at_selection(s))
                .collect()
        })
        .collect();
    let measured: Vec<(String, Option<usize>)> = read[0][0]
        .metrics
        .iter()
        .map(|m| (m.metric.clone(), m.level))
        .collect();
    let mut keys = resolve_metrics(metrics, &measured)?;
    let key = validation.metric()?;
    let selection_metric = match keys.iter().position(|k| *k == key) {
        Some(i) => i,
        None => {
            keys.insert(0, key);
            0
        }
    };
    let samples: Vec<Sample> = selections
        .iter()
        .map(|s| {
            let values = per_seed(&|i| Ok(s[i].value))?;
            Ok(Sample::new(values).with_seeds(seeds.to_vec()))
        })
        .collect::<Result<_>>()?;
    let chosen = best(samples.iter().map(Sample::mean)).ok_or_else(|| {
        Error::invalid(
            "[validation]",
            "no point has a validation value that is a number: nothing to choose on",
        )
    })?;
    let mut versus = versus_baseline(labels, std::slice::from_ref(&samples), chosen)
        .remove(0)
        .into_iter();
    let mut candidates = Vec::with_capacity(points.len());
    for (p, point) in points.into_iter().enumerate() {
        let test = keys
            .iter()
            .map(|(m, l)| {
                let values = per_seed(&|i| read[p][i].metric(m, *l))?;
                Ok(arm_values(&labels[p], Sample::new(values)))
            })
            .collect::<Result<Vec<ArmValues>>>()?;
        let fold_validation = if folds > 1 {
            selections[p]
                .chunks(seeds.len())
                .map(|fold| fold.iter().map(|s| s.value).collect())
                .collect()
        } else {
            Vec::new()
        };
        candidates.push(Candidate {
            label: labels[p].clone(),
            overrides: point,
            recipe: runs[p][0].recipe.clone(),
            validation: arm_values(&labels[p], samples[p].clone()),
            fold_validation,
            selected_epochs: selections[p].iter().map(|s| s.epoch).collect(),
            test,
            concatenated: Vec::new(),
            versus_chosen: if p == chosen { None } else { versus.next() },
        });
    }
    // On a tie with the chosen point, the test set's choice is the chosen point: no optimism.
    let test_means: Vec<f64> = candidates
        .iter()
        .map(|c| c.test[selection_metric].mean)
        .collect();
    let test_choice = best(test_means.iter().copied()).map(|t| {
        if test_means[t] == test_means[chosen] {
            chosen
        } else {
            t
        }
    });
    let optimism = test_choice.map_or(f64::NAN, |t| {
        candidates[t].test[selection_metric].mean - candidates[chosen].test[selection_metric].mean
    });
    let devices = devices_of(runs);
    Ok(Tuning {
        search: search.clone(),
        seeds: seeds.to_vec(),
        run_code: String::new(),
        devices,
        validation: validation.clone(),
        metrics: keys,
        candidates,
        chosen,
        selection_metric,
        test_choice,
        optimism,
    })
}

/// A metric as the tables name it: `NAME` at the finest level or without one, else
/// `NAME:LEVEL`.
pub fn metric_label(metric: &str, level: Option<usize>) -> String {
    match level {
        Some(l) if l > 0 => format!("{metric}:{l}"),
        _ => metric.to_string(),
    }
}

/// The index of the largest value, the first on a tie; NaN never wins. `None` when every value
/// is NaN (or there is none).
fn best(values: impl Iterator<Item = f64>) -> Option<usize> {
    values
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .fold(None::<(usize, f64)>, |b, (i, v)| match b {
            Some((_, bv)) if bv >= v => b,
            _ => Some((i, v)),
        })
        .map(|(i, _)| i)
}

impl Tuning {
    /// The folds each point was cross-validated over (1: a single split).
    pub fn folds(&self) -> usize {
        self.validation.cross_validation_folds()
    }

    /// What the choice was made on, for a table's heading: `20% of the training split's classes
    /// held out`, or `4-fold cross-validation over the training split's classes`.
    pub fn held_out_text(&self) -> String {
        match self.folds() {
            1 => format!("{} held out", self.validation.describe()),
            k => format!("{k}-fold cross-validation over the training split's classes"),
        }
    }

    /// With folds, the point each fold alone would have chosen: the best mean over the seeds of
    /// that fold's validation values (the first on a tie; `None` when none is a number). Empty
    /// for a single split. Folds that disagree show how much one split's choice is a draw of
    /// its classes.
    pub fn fold_choices(&self) -> Vec<Option<usize>> {
        let means: Vec<Vec<f64>> = self.candidates.iter().map(Candidate::fold_means).collect();
        (0..means[0].len())
            .map(|f| best(means.iter().map(|m| m[f])))
            .collect()
    }

    /// With folds, what concatenating point `p`'s fold models adds to their mean on the test
    /// set, in the validation's metric: the paired t-test over the seeds of each seed's
    /// [`Candidate::concatenated`] value minus its [`Candidate::test`] value. `None` for a
    /// single split.
    pub fn concatenation_gain(&self, p: usize) -> Option<PairedT> {
        let c = &self.candidates[p];
        let together = c.concatenated.get(self.selection_metric)?;
        let apart = &c.test[self.selection_metric];
        let d: Vec<f64> = together
            .values
            .iter()
            .zip(&apart.values)
            .map(|(a, b)| a - b)
            .collect();
        Some(paired_t(&d))
    }

    /// The order to show the points in: a grid's own order; a random search's points sorted
    /// by their values, key by key in the order of the ranges (numbers by value, other values
    /// as text), so that a table of them reads along each range.
    pub fn display_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.candidates.len()).collect();
        if let Search::Random { ranges, .. } = &self.search {
            // Each point's values, read once: (number or NaN, text) per range.
            let keys: Vec<Vec<(f64, &str)>> = self
                .candidates
                .iter()
                .map(|c| {
                    ranges
                        .iter()
                        .map(|r| {
                            let v = override_value(&c.overrides, &r.key).unwrap_or("");
                            (v.parse().unwrap_or(f64::NAN), v)
                        })
                        .collect()
                })
                .collect();
            order.sort_by(|&a, &b| {
                keys[a]
                    .iter()
                    .zip(&keys[b])
                    .map(|((x, s), (y, t))| x.total_cmp(y).then_with(|| s.cmp(t)))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        }
        order
    }

    /// One chart per numeric key searched ([`super::search::numeric_values`]): each point's mean
    /// validation value and mean test value of the validation's metric, with their 95%
    /// intervals over the seeds, against the key's value, and the chosen point marked; a
    /// logarithmic axis when the values span a factor of ten or more. Points are joined by a
    /// line when the search varies that key alone, else drawn as markers (the other keys vary
    /// between them).
    ///
    /// ```
    /// use rankwise::experiments::tune::{tune_runs, Search};
    /// use rankwise::experiments::{MetricValue, RunResult};
    /// use rankwise::train::{MetricsLog, ValidationConfig};
    /// let run = |val: f64| {
    ///     let mut log = MetricsLog::default();
    ///     log.push(1, 0, "val", "R@1", Some(0), val);
    ///     log.push(1, 0, "test", "R@1", Some(0), val / 2.0);
    ///     RunResult { label: String::new(), recipe: String::new(), log: log.rows().to_vec(),
    ///                 metrics: vec![MetricValue { metric: "R@1".into(), level: Some(0),
    ///                                             value: val / 2.0 }],
    ///                 seconds: 0.0, test_queries: 10, seed: 0, device: "cpu".into(),
    ///                 code: String::new() }
    /// };
    /// let search = Search::Grid { axes: vec!["loss.tau=0.01,0.1,1.0".parse()?] };
    /// let runs: Vec<Vec<RunResult>> =
    ///     [0.5, 0.75, 0.25].iter().map(|&v| vec![run(v), run(v + 0.125)]).collect();
    /// let labels: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    /// let t = tune_runs(&search, &labels, &[0, 1], &runs, &[], &ValidationConfig::default())?;
    /// let charts = t.charts();
    /// let (key, chart) = &charts[0];
    /// assert_eq!(key, "loss.tau");
    /// assert!(chart.log_x); // 0.01 to 1.0
    /// assert_eq!(chart.series[0].points, [(0.01, 0.5625), (0.1, 0.8125), (1.0, 0.3125)]);
    /// assert_eq!(chart.series[2].points, [(0.1, 0.8125)]); // the chosen point
    /// # Ok::<(), rankwise::Error>(())
    /// ```
    pub fn charts(&self) -> Vec<(String, LineChart)> {
        let metric = self.selection_metric_name();
        let alone = self.search.keys().len() == 1;
        self.numeric_values()
            .into_iter()
            .map(|(key, xs)| {
                let mut rows: Vec<(f64, &Candidate)> =
                    xs.iter().copied().zip(&self.candidates).collect();
                rows.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (low, high) = (rows[0].0, rows[rows.len() - 1].0);
                let style = if alone {
                    SeriesStyle::LineAndMarkers(Marker::Circle)
                } else {
                    SeriesStyle::Markers(Marker::Circle)
                };
                // A point without a value (a metric a run could not compute) is left out of
                // that series: a chart draws finite points only.
                let series = |name: String, value: &dyn Fn(&Candidate) -> &ArmValues| {
                    let drawn: Vec<(f64, &ArmValues)> = rows
                        .iter()
                        .map(|(x, c)| (*x, value(c)))
                        .filter(|(_, v)| v.mean.is_finite())
                        .collect();
                    Series::line(name, drawn.iter().map(|(x, v)| (*x, v.mean)).collect())
                        .with_intervals(
                            drawn.iter().map(|(_, v)| v.half_width).collect(),
                            IntervalStyle::Bars,
                        )
                        .styled(style)
                };
                let chosen = &self.candidates[self.chosen];
                let x = xs[self.chosen];
                let mut chart = LineChart::new(
                    format!("{}: {metric} along {key}", self.search.describe()),
                    key.clone(),
                    format!(
                        "{metric} (mean over {} seeds, 95% interval)",
                        self.seeds.len()
                    ),
                    vec![
                        series(format!("validation {metric} (held-out classes)"), &|c| {
                            &c.validation
                        }),
                        series(format!("test {metric}"), &|c| {
                            &c.test[self.selection_metric]
                        }),
                        Series::line("chosen", vec![(x, chosen.validation.mean)])
                            .styled(SeriesStyle::Markers(Marker::Cross))
                            .colored(7),
                    ],
                );
                chart.log_x = low > 0.0 && high >= 10.0 * low;
                chart.series.retain(|s| !s.points.is_empty());
                // Half-widths are NaN with a single seed, which a chart cannot draw.
                for s in &mut chart.series {
                    if s.intervals
                        .as_ref()
                        .is_some_and(|h| h.iter().any(|v| !v.is_finite()))
                    {
                        s.intervals = None;
                    }
                }
                (key, chart)
            })
            .collect()
    }

    /// The numeric keys whose chosen value is the lowest or the highest of the (at least
    /// three) values searched, each with that value and `"lowest"` or `"highest"`: the best may
    /// lie beyond what was searched, and a search extended past that edge would tell.
    pub fn chosen_at_edge(&self) -> Vec<(String, String, &'static str)> {
        let chosen = &self.candidates[self.chosen].overrides;
        self.numeric_values()
            .into_iter()
            .filter_map(|(key, xs)| {
                let value = xs[self.chosen];
                let mut values = xs;
                values.sort_by(f64::total_cmp);
                values.dedup();
                let edge = match value {
                    _ if values.len() < 3 => return None,
                    v if v == values[0] => "lowest",
                    v if v == values[values.len() - 1] => "highest",
                    _ => return None,
                };
                let text = override_value(chosen, &key)?.to_string();
                Some((key, text, edge))
            })
            .collect()
    }

    /// Each numeric key searched with its value at every candidate, in the candidates' order
    /// ([`super::search::numeric_values`] of the points the candidates trained: read from
    /// their overrides, not drawn again).
    fn numeric_values(&self) -> Vec<(String, Vec<f64>)> {
        let points: Vec<Vec<String>> = self
            .candidates
            .iter()
            .map(|c| c.overrides.clone())
            .collect();
        super::search::numeric_values(&self.search, &points)
    }

    /// The validation's metric as the tables name it (`R@1`, `mAP@R:1`, `H-AP`).
    pub fn selection_metric_name(&self) -> String {
        let (m, l) = &self.metrics[self.selection_metric];
        metric_label(m, *l)
    }

    /// The points the validation cannot tell from the chosen one (inside the seeds' noise), in
    /// [`Tuning::display_order`].
    pub fn indistinct(&self) -> Vec<&Candidate> {
        self.display_order()
            .into_iter()
            .map(|i| &self.candidates[i])
            .filter(|c| {
                c.versus_chosen
                    .as_ref()
                    .is_some_and(|v| v.finding != super::compare::Finding::Lower)
            })
            .collect()
    }

    /// What the search found, in sentences generated from its numbers: the choice and its test
    /// result, how sure the choice is, and what a choice on the test classes would have
    /// reported.
    pub fn reading(&self) -> String {
        let metric = self.selection_metric_name();
        let chosen = &self.candidates[self.chosen];
        let test = &chosen.test[self.selection_metric];
        let folds = self.folds();
        let (on, models) = if folds > 1 {
            (
                format!(
                    "by {folds}-fold cross-validation over the training split's classes (every \
                     class held out by one fold; a point's value is the mean of its {folds} fold \
                     runs)"
                ),
                format!("(the mean of its {folds} fold models, each at the epoch its validation selected)"),
            )
        } else {
            (
                format!("on the held-out classes ({})", self.validation.describe()),
                "at the epochs its validation selected".to_string(),
            )
        };
        let mut text = format!(
            "Chosen {on}: {} (validation {metric} {:.4}). Its test {metric} {models} is {:.4} ± \
             {:.4} over {} seeds: the result to report, since neither the point nor the epochs \
             saw the test classes.",
            chosen.label,
            chosen.validation.mean,
            test.mean,
            test.half_width,
            self.seeds.len()
        );
        if let (Some(gain), Some(together)) = (
            self.concatenation_gain(self.chosen),
            chosen.concatenated.get(self.selection_metric),
        ) {
            text.push_str(&format!(
                " Its {folds} fold models as one, their embeddings concatenated (each \
                 L2-normalised: Musgrave et al.'s concatenated result, beside the separated mean \
                 above), reach test {metric} {:.4} ± {:.4}: {:+.4} [{:+.4}, {:+.4}] over the \
                 mean of the fold models, {} the seeds' noise (paired t-test over the {} seeds, \
                 p {}).",
                together.mean,
                together.half_width,
                gain.mean,
                gain.interval.0,
                gain.interval.1,
                if gain.significant() {
                    "beyond"
                } else {
                    "inside"
                },
                gain.n,
                format_p(gain.p)
            ));
        }
        for (key, value, edge) in self.chosen_at_edge() {
            text.push_str(&format!(
                " Its {key} ({value}) is the {edge} value searched: the best may lie beyond it, \
                 and a search extended past it would tell."
            ));
        }
        let fold_choices = self.fold_choices();
        if !fold_choices.is_empty() {
            let agree = fold_choices
                .iter()
                .filter(|&&c| c == Some(self.chosen))
                .count();
            let others: Vec<String> = fold_choices
                .iter()
                .enumerate()
                .filter_map(|(f, c)| match c {
                    Some(c) if *c != self.chosen => {
                        Some(format!("fold {f}: {}", self.candidates[*c].label))
                    }
                    Some(_) => None,
                    None => Some(format!("fold {f}: none, no value")),
                })
                .collect();
            if others.is_empty() {
                text.push_str(&format!(
                    " Each of the {} folds alone would have chosen it too.",
                    fold_choices.len()
                ));
            } else {
                text.push_str(&format!(
                    " Alone, {agree} of the {} folds would have chosen it, the others another \
                     point ({}): a single split's choice depends on which classes it holds out.",
                    fold_choices.len(),
                    others.join(", ")
                ));
            }
        }
        let close = self.indistinct();
        if close.is_empty() {
            text.push_str(&format!(
                " Every other point is lower on validation beyond the seeds' noise (paired \
                 t-tests over the {} seeds, Holm-corrected).",
                self.seeds.len()
            ));
        } else {
            let names: Vec<String> = close.iter().map(|c| format!("`{}`", c.label)).collect();
            text.push_str(&format!(
                " The validation cannot tell it from {} (paired t-tests over the {} seeds, \
                 Holm-corrected): with other seeds, {} could as well have been chosen.",
                names.join(", "),
                self.seeds.len(),
                if close.len() == 1 {
                    "that point"
                } else {
                    "those points"
                }
            ));
        }
        match self.test_choice {
            Some(t) if t == self.chosen => text.push_str(&format!(
                " The test classes would have chosen the same point: the choice of \
                 hyperparameters added no optimism here ({metric} read at the epochs the \
                 validation selected)."
            )),
            Some(t) => {
                let other = &self.candidates[t];
                text.push_str(&format!(
                    " Chosen on the test classes instead, the search would have reported {} with \
                     test {metric} {:.4}: {:+.4} over the honest result, the optimism of tuning \
                     on the test set.",
                    other.label, other.test[self.selection_metric].mean, self.optimism
                ));
            }
            None => text.push_str(&format!(
                " No point has a test {metric} that is a number: no test choice to set beside it."
            )),
        }
        text
    }
}

/// Writes `tuning` to `path`, atomically: `.json`, all of it (recipes and every seed's value);
/// `.csv`, one line per point (`point,chosen,test_choice,n,val_metric,val_mean,val_half_width,
/// selected_epochs,p_holm_vs_chosen,finding_vs_chosen`, then `mean` and `half_width` of each
/// test metric and, with folds, each fold's mean validation value, `val fold i mean`, then
/// `mean` and `half_width` of each test metric of the concatenated fold models, `concat test
/// METRIC mean`).
pub fn write_tuning(path: &Path, tuning: &Tuning) -> Result<()> {
    match ResultFormat::from_path(path)? {
        ResultFormat::Json => write_json(path, tuning),
        ResultFormat::Csv => write_atomically(path, |w| write_csv(w, tuning)),
    }
}

fn write_csv(w: &mut dyn Write, tuning: &Tuning) -> std::io::Result<()> {
    let mut out = csv::Writer::from_writer(w);
    let mut header: Vec<String> = [
        "point",
        "chosen",
        "test_choice",
        "n",
        "val_metric",
        "val_mean",
        "val_half_width",
        "selected_epochs",
        "p_holm_vs_chosen",
        "finding_vs_chosen",
    ]
    .map(String::from)
    .into();
    for (m, l) in &tuning.metrics {
        let name = l.map_or(m.clone(), |l| format!("{m}:{l}"));
        header.push(format!("test {name} mean"));
        header.push(format!("test {name} half_width"));
    }
    let folds = tuning.candidates[0].fold_validation.len();
    header.extend((0..folds).map(|f| format!("val fold {f} mean")));
    if !tuning.candidates[0].concatenated.is_empty() {
        for (m, l) in &tuning.metrics {
            let name = l.map_or(m.clone(), |l| format!("{m}:{l}"));
            header.push(format!("concat test {name} mean"));
            header.push(format!("concat test {name} half_width"));
        }
    }
    out.write_record(&header)?;
    let metric = tuning.selection_metric_name();
    for (i, c) in tuning.candidates.iter().enumerate() {
        let epochs: Vec<String> = c.selected_epochs.iter().map(u64::to_string).collect();
        let mut record = vec![
            c.label.clone(),
            (i == tuning.chosen).to_string(),
            (Some(i) == tuning.test_choice).to_string(),
            c.validation.values.len().to_string(),
            metric.clone(),
            csv_f64(c.validation.mean),
            csv_f64(c.validation.half_width),
            epochs.join(" "),
        ];
        match &c.versus_chosen {
            Some(v) => record.extend([csv_f64(v.p_holm), v.finding.as_str().to_string()]),
            None => record.extend([String::new(), String::new()]),
        }
        for t in &c.test {
            record.extend([csv_f64(t.mean), csv_f64(t.half_width)]);
        }
        record.extend(c.fold_means().into_iter().map(csv_f64));
        for t in &c.concatenated {
            record.extend([csv_f64(t.mean), csv_f64(t.half_width)]);
        }
        out.write_record(&record)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::compare::Finding;
    use crate::experiments::MetricValue;

    /// A run whose log has, at each epoch `e + 1`, validation R@1 `val[e]` and test R@1 and
    /// mAP@R `test[e]` and `test[e] / 4`; its final metrics are the last epoch's.
    fn run(label: &str, val: &[f64], test: &[f64]) -> RunResult {
        let mut log = crate::train::MetricsLog::default();
        for (e, (&v, &t)) in val.iter().zip(test).enumerate() {
            let e = e as u64 + 1;
            log.push(e, 10 * e, "train", "loss_mean", None, 1.0);
            log.push(e, 10 * e, "val", "R@1", Some(0), v);
            log.push(e, 10 * e, "test", "R@1", Some(0), t);
            log.push(e, 10 * e, "test", "mAP@R", Some(0), t / 4.0);
        }
        let last = *test.last().unwrap();
        RunResult {
            label: label.into(),
            recipe: format!("# {label}"),
            metrics: vec![
                MetricValue {
                    metric: "R@1".into(),
                    level: Some(0),
                    value: last,
                },
                MetricValue {
                    metric: "mAP@R".into(),
                    level: Some(0),
                    value: last / 4.0,
                },
            ],
            log: log.rows().to_vec(),
            seconds: 1.0,
            test_queries: 10,
            seed: 0,
            device: "cpu".into(),
            code: String::new(),
        }
    }

    fn axis(n: usize) -> Search {
        let values: Vec<String> = (0..n).map(|i| format!("0.{}", i + 1)).collect();
        Search::Grid {
            axes: vec![format!("loss.tau={}", values.join(",")).parse().unwrap()],
        }
    }

    fn labels(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("p{i}")).collect()
    }

    #[test]
    fn random_points_are_shown_along_their_ranges_and_a_grid_in_its_order() {
        let runs: Vec<Vec<RunResult>> = (0..5)
            .map(|p| {
                vec![
                    run("s0", &[0.1 * p as f64], &[0.1]),
                    run("s1", &[0.1 * p as f64 + 0.01], &[0.1]),
                ]
            })
            .collect();
        let random = Search::Random {
            ranges: vec![
                "loss.kind=choice(b,a)".parse().unwrap(),
                "loss.tau=loguniform(0.001,1)".parse().unwrap(),
            ],
            samples: 5,
            seed: 1,
        };
        let t = tune_runs(
            &random,
            &labels(5),
            &[0, 1],
            &runs,
            &[],
            &ValidationConfig::default(),
        )
        .unwrap();
        let shown: Vec<(String, f64)> = t
            .display_order()
            .iter()
            .map(|&i| {
                let o = &t.candidates[i].overrides;
                (
                    override_value(o, "loss.kind").unwrap().to_string(),
                    override_value(o, "loss.tau").unwrap().parse().unwrap(),
                )
            })
            .collect();
        let mut sorted = shown.clone();
        sorted.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        assert_eq!(shown, sorted);
        let mut order = t.display_order();
        assert_ne!(
            order,
            (0..5).collect::<Vec<_>>(),
            "the draws came sorted: pick another seed"
        );
        order.sort();
        assert_eq!(order, (0..5).collect::<Vec<_>>());
        let grid = tune_runs(
            &axis(3),
            &labels(3),
            &[0, 1],
            &runs[..3],
            &[],
            &ValidationConfig::default(),
        )
        .unwrap();
        assert_eq!(grid.display_order(), [0, 1, 2]);
    }

    #[test]
    fn charts_draw_each_numeric_key_with_the_choice_marked() {
        // Point 1 has no test value.
        let runs: Vec<Vec<RunResult>> = (0..4)
            .map(|p| {
                let test = if p == 1 { f64::NAN } else { 0.1 };
                vec![run("s0", &[0.1 * p as f64 + 0.1], &[test])]
            })
            .collect();
        // Two keys drawn at random: markers (the other key varies between the points); the
        // choice key is not a number, so one chart. One seed: no intervals to draw.
        let random = Search::Random {
            ranges: vec![
                "loss.tau=uniform(0.1,0.5)".parse().unwrap(),
                "loss.kind=choice(a,b)".parse().unwrap(),
            ],
            samples: 4,
            seed: 0,
        };
        let t = tune_runs(
            &random,
            &labels(4),
            &[0],
            &runs,
            &[],
            &ValidationConfig::default(),
        )
        .unwrap();
        let charts = t.charts();
        assert_eq!(charts.len(), 1);
        let (key, chart) = &charts[0];
        assert_eq!(key, "loss.tau");
        assert!(!chart.log_x, "0.1 to 0.5 spans less than a factor of ten");
        assert_eq!(chart.series[0].style, SeriesStyle::Markers(Marker::Circle));
        assert!(chart.series.iter().all(|s| s.intervals.is_none()));
        assert_eq!(
            (chart.series[0].points.len(), chart.series[1].points.len()),
            (4, 3)
        );
        let xs: Vec<f64> = chart.series[0].points.iter().map(|p| p.0).collect();
        assert!(xs.windows(2).all(|w| w[0] <= w[1]), "{xs:?}");
        let chosen: f64 = override_value(&t.candidates[t.chosen].overrides, "loss.tau")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(chart.series[2].points, [(chosen, 0.4)]);
        let svg = crate::report::render_svg(chart, (400, 300)).unwrap();
        assert!(svg.contains("chosen") && svg.contains("loss.tau"));
    }

    #[test]
    fn a_choice_at_the_edge_of_what_was_searched_is_said() {
        // p1 is chosen (validation 0.5 against 0.3 and 0.2).
        let runs: Vec<Vec<RunResult>> = [0.3, 0.5, 0.2]
            .iter()
            .map(|&v| vec![run("s0", &[v], &[0.1]), run("s1", &[v + 0.01], &[0.1])])
            .collect();
        let with = |search: Search| {
            let n = search.points().unwrap().len();
            tune_runs(
                &search,
                &labels(n),
                &[0, 1],
                &runs[..n],
                &[],
                &ValidationConfig::default(),
            )
            .unwrap()
        };
        let grid = |axes: &[&str]| Search::Grid {
            axes: axes.iter().map(|a| a.parse().unwrap()).collect(),
        };
        // In the middle of τ's values: nothing to say.
        let t = with(axis(3));
        assert_eq!(t.candidates[t.chosen].overrides, ["loss.tau=0.2"]);
        assert!(t.chosen_at_edge().is_empty());
        assert!(!t.reading().contains("value searched"));
        // The lowest of three (listed in any order), and the highest.
        let t = with(grid(&["loss.tau=0.2,0.01,0.3"]));
        assert_eq!(
            t.chosen_at_edge(),
            [("loss.tau".to_string(), "0.01".to_string(), "lowest")]
        );
        let reading = t.reading();
        assert!(
            reading.contains(
                "Its loss.tau (0.01) is the lowest value searched: the best may lie beyond it"
            ),
            "{reading}"
        );
        let t = with(grid(&["loss.tau=0.2,3,0.3"]));
        assert_eq!(t.chosen_at_edge()[0].2, "highest");
        // Two values (every choice is an edge) or values that are not numbers: nothing.
        assert!(with(grid(&["loss.tau=0.2,3"])).chosen_at_edge().is_empty());
        assert!(with(grid(&["loss.kind=a,b,c"])).chosen_at_edge().is_empty());
    }

    #[test]
    fn the_choice_is_the_best_mean_validation_and_each_other_point_is_tested_against_it() {
        // Four seeds. p0: validation far below p1 on every seed. p1: the best. p2: a hair
        // below p1 on average, above it on two seeds: inside the noise. The test set prefers
        // p2 (its R@1 peaks after the epoch its validation selected, so the selected reading
        // is what counts).
        let runs = vec![
            vec![
                run("p0 s0", &[0.20, 0.21], &[0.10, 0.11]),
                run("p0 s1", &[0.22, 0.23], &[0.10, 0.12]),
                run("p0 s2", &[0.21, 0.20], &[0.11, 0.10]),
                run("p0 s3", &[0.23, 0.24], &[0.12, 0.12]),
            ],
            vec![
                run("p1 s0", &[0.50, 0.40], &[0.30, 0.50]),
                run("p1 s1", &[0.52, 0.45], &[0.31, 0.50]),
                run("p1 s2", &[0.48, 0.51], &[0.29, 0.32]),
                run("p1 s3", &[0.53, 0.50], &[0.30, 0.50]),
            ],
            vec![
                run("p2 s0", &[0.51, 0.30], &[0.33, 0.50]),
                run("p2 s1", &[0.49, 0.30], &[0.34, 0.50]),
                run("p2 s2", &[0.50, 0.30], &[0.35, 0.50]),
                run("p2 s3", &[0.52, 0.30], &[0.32, 0.50]),
            ],
        ];
        let t = tune_runs(
            &axis(3),
            &labels(3),
            &[0, 1, 2, 3],
            &runs,
            &["mAP@R".parse().unwrap()],
            &ValidationConfig::default(),
        )
        .unwrap();
        assert_eq!(t.chosen, 1);
        let c1 = &t.candidates[1];
        assert_eq!(c1.validation.values, vec![0.50, 0.52, 0.51, 0.53]);
        assert_eq!(c1.selected_epochs, vec![1, 1, 2, 1]);
        // The validation's metric was not named: added first.
        assert_eq!(t.selection_metric, 0);
        assert_eq!(
            t.metrics,
            vec![("R@1".to_string(), Some(0)), ("mAP@R".to_string(), Some(0))]
        );
        assert_eq!(c1.test[0].values, vec![0.30, 0.31, 0.32, 0.30]);
        assert_eq!(c1.test[1].values, vec![0.075, 0.0775, 0.08, 0.075]);
        assert!(c1.versus_chosen.is_none());
        assert_eq!(c1.overrides, ["loss.tau=0.2"]);
        let v0 = t.candidates[0].versus_chosen.as_ref().unwrap();
        let v2 = t.candidates[2].versus_chosen.as_ref().unwrap();
        assert_eq!(
            (v0.finding, v2.finding),
            (Finding::Lower, Finding::InsideTheNoise)
        );
        assert_eq!((v0.baseline.as_str(), v2.arm.as_str()), ("p1", "p2"));
        // Holm over the two comparisons, and the library's paired test.
        let d: Vec<f64> = [0.51, 0.49, 0.50, 0.52]
            .iter()
            .zip([0.50, 0.52, 0.51, 0.53])
            .map(|(a, b)| a - b)
            .collect();
        assert!((v2.p - crate::stats::paired_t(&d).p).abs() < 1e-12);
        assert!(v2.p_holm >= v2.p && v2.p_holm <= 2.0 * v2.p + 1e-15);
        assert_eq!(t.indistinct().len(), 1);
        // The test set would have chosen p2 (mean 0.335 against 0.3075).
        assert_eq!(t.test_choice, Some(2));
        assert!((t.optimism - (0.335 - 0.3075)).abs() < 1e-12);
        let reading = t.reading();
        for says in [
            "Chosen on the held-out classes (20% of the training split's classes): p1",
            "0.3075",
            "cannot tell it from `p2`",
            "that point could as well",
            "would have reported p2 with test R@1 0.3350: +0.0275",
        ] {
            assert!(reading.contains(says), "no `{says}` in: {reading}");
        }
        // The validation's metric named second: found there, not added.
        let t = tune_runs(
            &axis(3),
            &labels(3),
            &[0, 1, 2, 3],
            &runs,
            &["mAP@R".parse().unwrap(), "R@1".parse().unwrap()],
            &ValidationConfig::default(),
        )
        .unwrap();
        assert_eq!((t.selection_metric, t.metrics.len()), (1, 2));
    }

    #[test]
    fn with_folds_each_seed_is_the_mean_of_its_fold_runs_and_the_tests_pair_the_seeds() {
        // Two points, 3 seeds, 2 folds: runs[p][f × 3 + s]. On fold 0 p0 leads; on fold 1 p1
        // leads by more, so the fold means choose p1 though one split alone would not.
        let v = |p: usize, f: usize, s: usize| match (p, f) {
            (0, 0) => 0.60 + 0.01 * s as f64,
            (0, _) => 0.30 + 0.01 * s as f64,
            (_, 0) => 0.55 + 0.01 * s as f64,
            _ => 0.50 + 0.02 * s as f64,
        };
        let runs: Vec<Vec<RunResult>> = (0..2)
            .map(|p| {
                (0..2)
                    .flat_map(|f| {
                        (0..3).map(move |s| {
                            // The test R@1 at the selected epoch 1 encodes (p, f, s).
                            let t = 0.1 * (p + 1) as f64 + 0.01 * f as f64 + 0.001 * s as f64;
                            run("r", &[v(p, f, s), v(p, f, s) - 0.1], &[t, 0.99])
                        })
                    })
                    .collect()
            })
            .collect();
        let cv = ValidationConfig {
            folds: Some(2),
            ..ValidationConfig::default()
        };
        let t = tune_runs(&axis(2), &labels(2), &[0, 1, 2], &runs, &[], &cv).unwrap();
        assert_eq!(t.folds(), 2);
        assert_eq!(t.chosen, 1);
        let c = &t.candidates[1];
        let want = [
            (0.55 + 0.50) / 2.0,
            (0.56 + 0.52) / 2.0,
            (0.57 + 0.54) / 2.0,
        ];
        for (got, want) in c.validation.values.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{got} {want}");
        }
        assert_eq!(c.fold_validation.len(), 2);
        assert_eq!(c.fold_validation[1], [0.50, 0.52, 0.54]);
        let means = c.fold_means();
        assert!((means[0] - 0.56).abs() < 1e-12 && (means[1] - 0.52).abs() < 1e-12);
        assert_eq!(c.selected_epochs, [1, 1, 1, 1, 1, 1]);
        // Test R@1 per seed: the mean of fold 0's 0.20 + s/1000 and fold 1's 0.21 + s/1000.
        for (s, got) in c.test[0].values.iter().enumerate() {
            assert!((got - (0.205 + 0.001 * s as f64)).abs() < 1e-12, "{got}");
        }
        // The paired test over the 3 seeds' fold means, not over 6 runs.
        let vs = t.candidates[0].versus_chosen.as_ref().unwrap();
        let d: Vec<f64> = (0..3)
            .map(|s| (v(0, 0, s) + v(0, 1, s)) / 2.0 - (v(1, 0, s) + v(1, 1, s)) / 2.0)
            .collect();
        assert!((vs.p - crate::stats::paired_t(&d).p).abs() < 1e-12);
        let reading = t.reading();
        assert!(
            reading.contains("by 2-fold cross-validation")
                && reading.contains("the mean of its 2 fold models"),
            "{reading}"
        );
        // Fold 0 alone prefers p0 (0.61 against 0.56), fold 1 p1: the reading says so.
        assert_eq!(t.fold_choices(), [Some(0), Some(1)]);
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("t.csv");
        write_tuning(&csv, &t).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with("val fold 0 mean,val fold 1 mean"),
            "{}",
            lines[0]
        );
        let last: Vec<f64> = lines[2]
            .rsplit(',')
            .take(2)
            .map(|v| v.parse().unwrap())
            .collect();
        assert!((last[1] - 0.56).abs() < 1e-12 && (last[0] - 0.52).abs() < 1e-12);
        assert!(
            reading.contains(
                "Alone, 1 of the 2 folds would have chosen it, the others another point (fold 0: \
                 p0)"
            ),
            "{reading}"
        );
        assert_eq!(
            t.held_out_text(),
            "2-fold cross-validation over the training split's classes"
        );
        // The fold models as one: filled by `tune` from the kept embeddings, not here.
        assert!(t.candidates.iter().all(|c| c.concatenated.is_empty()));
        assert!(t.concatenation_gain(t.chosen).is_none());
        let mut t = t;
        let chosen = t.chosen;
        let apart = t.candidates[chosen].test[0].values.clone();
        let together: Vec<f64> = apart
            .iter()
            .zip([0.05, 0.06, 0.04])
            .map(|(a, d)| a + d)
            .collect();
        for c in &mut t.candidates {
            c.concatenated = vec![arm_values(&c.label, Sample::new(together.clone()))];
        }
        let gain = t.concatenation_gain(chosen).unwrap();
        // d = (0.05, 0.06, 0.04): mean 0.05, sd 0.01, t = 8.66 with 2 df, p = 0.013.
        assert!(
            (gain.mean - 0.05).abs() < 1e-12 && (gain.p - 0.0131).abs() < 5e-4,
            "{gain:?}"
        );
        let reading = t.reading();
        assert!(
            reading.contains("Its 2 fold models as one, their embeddings concatenated")
                && reading.contains("+0.0500 [")
                && reading
                    .contains("beyond the seeds' noise (paired t-test over the 3 seeds, p 0.013)"),
            "{reading}"
        );
        write_tuning(&csv, &t).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0]
                .ends_with("val fold 1 mean,concat test R@1:0 mean,concat test R@1:0 half_width"),
            "{}",
            lines[0]
        );
        let mean: f64 = lines[1].rsplit(',').nth(1).unwrap().parse().unwrap();
        assert!((mean - together.iter().sum::<f64>() / 3.0).abs() < 1e-12);
        let json = dir.path().join("t.json");
        write_tuning(&json, &t).unwrap();
        let back: Tuning = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(back, t);
        // Runs of one fold only are the wrong shape.
        let one_fold: Vec<Vec<RunResult>> = runs.iter().map(|r| r[..3].to_vec()).collect();
        let e = tune_runs(&axis(2), &labels(2), &[0, 1, 2], &one_fold, &[], &cv)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 fold(s)"), "{e}");
        // A named fold is a single split: no fold means.
        let single = ValidationConfig {
            fold: Some(1),
            ..cv.clone()
        };
        let t = tune_runs(&axis(2), &labels(2), &[0, 1, 2], &one_fold, &[], &single).unwrap();
        assert_eq!((t.folds(), t.chosen), (1, 0));
        assert!(t.candidates[0].fold_validation.is_empty());
        assert!(t.fold_choices().is_empty());
        assert!(t
            .reading()
            .contains("(fold 1 of 2 of the training split's classes)"));
    }

    #[test]
    fn fold_arms_hold_each_fold_out_point_by_point() {
        let arm = |label: &str, tau: f64| Arm {
            label: label.into(),
            config: crate::train::TrainConfig {
                validation: Some(ValidationConfig {
                    folds: Some(3),
                    ..ValidationConfig::default()
                }),
                epochs: (tau * 100.0) as u64,
                ..crate::train::TrainConfig::default()
            },
        };
        let arms = [arm("a", 0.01), arm("b", 0.1)];
        let folds = fold_arms(&arms, 3);
        let labels: Vec<&str> = folds.iter().map(|a| a.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "a · fold 0",
                "a · fold 1",
                "a · fold 2",
                "b · fold 0",
                "b · fold 1",
                "b · fold 2"
            ]
        );
        let held: Vec<Option<u64>> = folds
            .iter()
            .map(|a| a.config.validation.as_ref().unwrap().fold)
            .collect();
        assert_eq!(held, [Some(0), Some(1), Some(2), Some(0), Some(1), Some(2)]);
        assert_eq!(folds[4].config.epochs, 10);
        assert_eq!(fold_arms(&arms, 1), arms.to_vec());
    }

    #[test]
    fn ties_go_to_the_first_point_and_a_nan_epoch_is_never_selected() {
        let same = |l| vec![run(l, &[0.4], &[0.2]), run(l, &[0.5], &[0.3])];
        // p0's first seed: a NaN validation value at epoch 1 and 0.9 at epoch 2, selected.
        let nan = vec![
            run("n", &[f64::NAN, 0.9], &[0.9, 0.1]),
            run("n", &[0.1, 0.2], &[0.9, 0.9]),
        ];
        let runs = vec![same("a"), nan, same("b")];
        let t = tune_runs(
            &axis(3),
            &labels(3),
            &[0, 1],
            &runs,
            &[],
            &ValidationConfig::default(),
        )
        .unwrap();
        assert_eq!(t.candidates[1].selected_epochs, [2, 2]);
        assert_eq!(t.candidates[1].test[0].values, [0.1, 0.9]);
        // p1's mean 0.55 beats the tie of p0 and p2 (0.45): chosen, then the tie alone.
        assert_eq!(t.chosen, 1);
        let tie = tune_runs(
            &axis(2),
            &labels(2),
            &[0, 1],
            &[same("a"), same("b")],
            &[],
            &ValidationConfig::default(),
        )
        .unwrap();
        assert_eq!(tie.chosen, 0);
        let v = tie.candidates[1].versus_chosen.as_ref().unwrap();
        // Equal values: no gap and no noise, nothing to decide.
        assert_eq!((v.finding, v.difference), (Finding::InsideTheNoise, 0.0));
        assert_eq!(tie.test_choice, Some(0));
        assert!(tie.reading().contains("would have chosen the same point"));
    }

    #[test]
    fn runs_without_validation_or_of_another_shape_are_errors() {
        let mut plain = run("p1 seed 1", &[0.3], &[0.2]);
        plain.log.retain(|r| r.split != "val");
        let runs = vec![
            vec![run("a", &[0.3], &[0.2]), run("a", &[0.3], &[0.2])],
            vec![run("b", &[0.3], &[0.2]), plain],
        ];
        let v = ValidationConfig::default();
        let e = tune_runs(&axis(2), &labels(2), &[0, 1], &runs, &[], &v)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p1 seed 1") && e.contains("no validation value"),
            "{e}"
        );
        let e = tune_runs(&axis(3), &labels(2), &[0, 1], &runs, &[], &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("search of 3 points"), "{e}");
        let e = tune_runs(&axis(2), &labels(2), &[0, 1, 2], &runs, &[], &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 seeds"), "{e}");
    }

    #[test]
    fn a_search_is_written_as_json_and_csv() {
        let runs: Vec<Vec<RunResult>> = (0..2)
            .map(|p| {
                (0..3)
                    .map(|s| run("r", &[0.3 + 0.1 * p as f64 + 0.01 * s as f64], &[0.2]))
                    .collect()
            })
            .collect();
        let t = tune_runs(
            &axis(2),
            &labels(2),
            &[0, 1, 2],
            &runs,
            &["all".parse().unwrap()],
            &ValidationConfig::default(),
        )
        .unwrap();
        assert_eq!(t.chosen, 1);
        // Equal test values: the test set's choice is the chosen point (a tie is no optimism).
        assert_eq!((t.test_choice, t.optimism), (Some(1), 0.0));
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("t.json");
        write_tuning(&json, &t).unwrap();
        let back: Tuning = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(back, t);
        // A single split has no fold models to concatenate: the JSON says nothing of them.
        let text = std::fs::read_to_string(&json).unwrap();
        assert!(!text.contains("concatenated"), "{text}");
        let csv = dir.path().join("t.csv");
        write_tuning(&csv, &t).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("point,chosen,test_choice,n,val_metric,val_mean"));
        assert!(lines[0].ends_with("test mAP@R:0 mean,test mAP@R:0 half_width"));
        assert!(
            lines[1].starts_with("p0,false,false,3,R@1,"),
            "{}",
            lines[1]
        );
        assert!(lines[2].starts_with("p1,true,true,3,R@1,"), "{}", lines[2]);
        assert!(lines[1].contains(",lower,"), "{}", lines[1]);
        assert!(write_tuning(&dir.path().join("t.txt"), &t).is_err());
    }

    #[test]
    fn best_takes_the_first_maximum_and_never_nan() {
        assert_eq!(best([0.1, 0.3, 0.3, 0.2].into_iter()), Some(1));
        assert_eq!(best([f64::NAN, 0.1, f64::NAN].into_iter()), Some(1));
        assert_eq!(best([f64::NAN].into_iter()), None);
        assert_eq!(best(std::iter::empty()), None);
        assert_eq!(best([-1.0, -0.5].into_iter()), Some(1));
    }
}

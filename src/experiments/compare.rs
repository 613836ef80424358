//! Your own recipes compared over seeds: two or more variants ("arms") of a recipe, each trained
//! with the same seeds, and every metric's difference to the first arm tested seed by seed —
//! the papers' claims' rule ([`crate::stats::compare`]) applied to a researcher's own change
//! (`rankwise compare`).
//!
//! **Why seeds.** A trained network's R@1 moves by 0.3–4.6 points from seed to seed on our
//! embedded data (median 1.5 at the `quick` scale), as much as many of the papers' effects. A
//! comparison of one run of each recipe, or a test over the test queries of one trained model
//! (`rankwise eval --versus`), measures the evaluation's noise but not the training's: two seeds
//! of the *same* recipe often differ "significantly" query by query. Only several trained
//! models per arm say whether a change beats that noise.
//!
//! **Why the same seeds.** A seed fixes a run's initial weights and its batches, so arm `a` and
//! the baseline trained with seed `s` share them (common random numbers) and their values move
//! together: the test of each seed's difference `d_s = a_s − b_s` (the paired t-test, `n − 1`
//! degrees of freedom) removes that shared part of the noise. On the committed standard tables
//! pairing made 56 more of 951 row pairs significant and 2 fewer than Welch's test.
//!
//! **The rule.** Each comparison (an arm against the first, on one metric) is the two-sided
//! paired t-test at 5% — or at Pocock's per-look level when the verdicts were read before at
//! smaller seed counts ([`crate::stats::sequential_level`], `looks`): adding seeds until a gap
//! turns significant would otherwise find effects by chance more often than 5%. With several
//! comparisons, Holm's step-down correction ([`holm`]) keeps the chance of calling any
//! no-effect comparison significant at that level. A comparison inside the noise says how many
//! seeds the same gap and noise would need ([`crate::stats::seeds_to_decide`], at the level
//! Holm asks of the smallest p-value), so that a tie is told from an under-powered gap.
//!
//! Runs go through a [`Runner`]: with a cache, every run is kept by its recipe and the run code,
//! so adding seeds or arms later trains only the new runs.

use super::runs::{RunResult, RunSpec, Runner};
use crate::error::{Error, Result};
use crate::io::results::{csv_f64, write_json, ResultFormat};
use crate::io::write_atomically;
use crate::stats::{self, Comparison, Sample, SeedsToDecide, Test};
use crate::train::overrides::load_with_overrides;
use crate::train::TrainConfig;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// One variant of a recipe: its label and what it trains (its seed is replaced by each seed of
/// the comparison).
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// The arm's name in tables.
    pub label: String,
    /// Its recipe.
    pub config: TrainConfig,
}

/// An arm as written on the command line: `LABEL`, or `LABEL: ITEM; ITEM; …` where each item
/// is a `KEY=VALUE` override of the recipe (as `rankwise train --set` reads it), and the first
/// item may be `@FILE`, another recipe to start from instead of the base one.
///
/// ```
/// use rankwise::experiments::compare::ArmSpec;
/// let arm: ArmSpec = "tau 0.1: loss.tau=0.1; epochs=8".parse()?;
/// assert_eq!(arm.label, "tau 0.1");
/// assert_eq!(arm.overrides, ["loss.tau=0.1", "epochs=8"]);
/// let other: ArmSpec = "fastap: @configs/embedded_fastap.toml".parse()?;
/// assert_eq!(other.recipe.as_deref(), Some(std::path::Path::new("configs/embedded_fastap.toml")));
/// assert!("".parse::<ArmSpec>().is_err());
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ArmSpec {
    /// The label (the text before the first `:`).
    pub label: String,
    /// The recipe file that replaces the base one (`@FILE`), if any.
    pub recipe: Option<PathBuf>,
    /// `KEY=VALUE` overrides, applied after the shared ones.
    pub overrides: Vec<String>,
}

impl FromStr for ArmSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid(format!("--arm {text:?}"), why.to_string());
        let (label, items) = text.split_once(':').unwrap_or((text, ""));
        let label = label.trim();
        if label.is_empty() {
            return Err(bad(
                "no label: write LABEL or LABEL: KEY=VALUE; KEY=VALUE (e.g. 'tau 0.1: loss.tau=0.1')",
            ));
        }
        let mut recipe = None;
        let mut overrides = Vec::new();
        for (i, item) in items
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            if let Some(file) = item.strip_prefix('@') {
                if i > 0 || file.trim().is_empty() {
                    return Err(bad(
                        "@FILE (another recipe) must come first and name a file",
                    ));
                }
                recipe = Some(PathBuf::from(file.trim()));
            } else if item.contains('=') {
                overrides.push(item.to_string());
            } else {
                return Err(bad(&format!(
                    "`{item}` is neither KEY=VALUE nor @FILE (items are separated by `;`)"
                )));
            }
        }
        Ok(ArmSpec {
            label: label.to_string(),
            recipe,
            overrides,
        })
    }
}

impl ArmSpec {
    /// The arm's recipe: its own file or `base`, with `shared` overrides and then its own.
    /// Errors name the arm and the file or override at fault.
    pub fn resolve(&self, base: &Path, shared: &[String]) -> Result<Arm> {
        let file = self.recipe.as_deref().unwrap_or(base);
        let overrides: Vec<String> = shared.iter().chain(&self.overrides).cloned().collect();
        let config = load_with_overrides(file, &overrides)
            .map_err(|e| Error::invalid(format!("arm `{}`", self.label), e.to_string()))?;
        Ok(Arm {
            label: self.label.clone(),
            config,
        })
    }
}

/// Which metric(s) a comparison reports: `all`, `NAME` (its finest level, or the metric without
/// a level such as H-AP) or `NAME:LEVEL`.
///
/// ```
/// use rankwise::experiments::compare::MetricChoice;
/// assert_eq!("R@1".parse::<MetricChoice>()?, MetricChoice::Named("R@1".into(), None));
/// assert_eq!("mAP@R:1".parse::<MetricChoice>()?, MetricChoice::Named("mAP@R".into(), Some(1)));
/// assert_eq!("all".parse::<MetricChoice>()?, MetricChoice::All);
/// assert!("R@1:x".parse::<MetricChoice>().is_err());
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricChoice {
    /// Every metric the runs measured, in their order.
    All,
    /// One metric, at a level (`None`: level 0, or no level).
    Named(String, Option<usize>),
}

impl FromStr for MetricChoice {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(MetricChoice::All);
        }
        let bad = |why: &str| Error::invalid(format!("--metric {text:?}"), why.to_string());
        let (name, level) = crate::retrieval::split_metric_level(text)
            .ok_or_else(|| bad("expected NAME or NAME:LEVEL with LEVEL a number (0 = finest)"))?;
        if name.is_empty() {
            return Err(bad("no metric name (e.g. R@1, mAP@R, H-AP, or all)"));
        }
        Ok(MetricChoice::Named(name.to_string(), level))
    }
}

/// `(metric, level)` of the runs' final evaluation that `choices` name, in the order given
/// (`all`: the runs' own order), each once. An unknown metric or level is an error listing what
/// the runs measured.
pub fn resolve_metrics(
    choices: &[MetricChoice],
    measured: &[(String, Option<usize>)],
) -> Result<Vec<(String, Option<usize>)>> {
    let mut out: Vec<(String, Option<usize>)> = Vec::new();
    let mut push = |k: &(String, Option<usize>)| {
        if !out.contains(k) {
            out.push(k.clone());
        }
    };
    for choice in choices {
        match choice {
            MetricChoice::All => measured.iter().for_each(&mut push),
            MetricChoice::Named(name, level) => {
                let levels: Vec<Option<usize>> = measured
                    .iter()
                    .filter(|(m, _)| m == name)
                    .map(|(_, l)| *l)
                    .collect();
                if levels.is_empty() {
                    let mut names: Vec<&str> = measured.iter().map(|(m, _)| m.as_str()).collect();
                    names.dedup();
                    return Err(Error::invalid(
                        format!("--metric {name}"),
                        format!(
                            "the runs did not measure it; they measured {}",
                            names.join(", ")
                        ),
                    ));
                }
                let pick = match level {
                    Some(l) => levels
                        .iter()
                        .find(|x| **x == Some(*l))
                        .copied()
                        .ok_or_else(|| {
                            Error::invalid(
                                format!("--metric {name}:{l}"),
                                format!(
                                    "the runs measured {name} at level(s) {}",
                                    level_list(&levels)
                                ),
                            )
                        })?,
                    // The finest level measured (levels are listed finest first), or none.
                    None => levels[0],
                };
                push(&(name.clone(), pick));
            }
        }
    }
    Ok(out)
}

/// Checks, before anything trains, that every named metric is one the arms' evaluations can
/// measure: `mAP`, `mAP@R`, `R-precision`, `H-AP`, `ASI`, `NDCG`, and `R@k` / `P@k` for the `k`
/// of every arm's `eval.recall_ks` (its levels are checked against the runs, [`resolve_metrics`]).
pub fn check_metric_names(choices: &[MetricChoice], arms: &[Arm]) -> Result<()> {
    const FIXED: [&str; 6] = crate::retrieval::METRIC_NAMES;
    for choice in choices {
        let MetricChoice::Named(name, _) = choice else {
            continue;
        };
        if FIXED.contains(&name.as_str()) {
            continue;
        }
        let k = crate::retrieval::cutoff_k(name);
        let missing: Vec<&str> = arms
            .iter()
            .filter(|a| !k.is_some_and(|k| a.config.eval.recall_ks.contains(&k)))
            .map(|a| a.label.as_str())
            .collect();
        if k.is_none() {
            return Err(Error::invalid(
                format!("--metric {name}"),
                format!("not a metric; use one of {}, R@k or P@k", FIXED.join(", ")),
            ));
        }
        if !missing.is_empty() {
            return Err(Error::invalid(
                format!("--metric {name}"),
                format!(
                    "arm(s) {} do not measure it: add its k to eval.recall_ks (--set \
                     eval.recall_ks=[…])",
                    missing.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn level_list(levels: &[Option<usize>]) -> String {
    levels
        .iter()
        .map(|l| l.map_or("-".to_string(), |l| l.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Holm's step-down adjustment of the p-values `p` (Holm 1979): sorted increasingly, the
/// `k`-th smallest (1-based) of `m` becomes `max_{j ≤ k} min(1, (m − j + 1) · p_(j))`, returned
/// in the input's order. Rejecting every adjusted p-value below `α` keeps the chance of rejecting
/// any true null hypothesis at most `α`, whatever the dependence between the tests.
///
/// ```
/// use rankwise::experiments::compare::holm;
/// let adjusted = holm(&[0.01, 0.04, 0.03]);
/// // Sorted 0.01, 0.03, 0.04: 3 · 0.01, 2 · 0.03, then max(0.06, 1 · 0.04).
/// assert!((adjusted[0] - 0.03).abs() < 1e-15);
/// assert!((adjusted[2] - 0.06).abs() < 1e-15);
/// assert!((adjusted[1] - 0.06).abs() < 1e-15);
/// ```
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![0.0; m];
    let mut running = 0.0f64;
    for (k, &i) in order.iter().enumerate() {
        running = running.max(((m - k) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// One arm's values of one metric over the seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmValues {
    /// The arm.
    pub arm: String,
    /// Its value for each seed, in the comparison's seed order.
    pub values: Vec<f64>,
    /// Their mean.
    #[serde(with = "crate::io::json_f64")]
    pub mean: f64,
    /// The half-width of its 95% interval (Student's t, `n − 1` degrees of freedom).
    #[serde(with = "crate::io::json_f64")]
    pub half_width: f64,
}

/// What a comparison found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// The arm is higher than the baseline beyond the noise (Holm-adjusted p below the level).
    Higher,
    /// The arm is lower beyond the noise.
    Lower,
    /// The gap is inside the seed-to-seed noise.
    InsideTheNoise,
    /// A value is not a number (a metric no query could count): nothing to test.
    Undefined,
}

impl Finding {
    /// The finding in words.
    pub fn as_str(self) -> &'static str {
        match self {
            Finding::Higher => "higher",
            Finding::Lower => "lower",
            Finding::InsideTheNoise => "inside the noise",
            Finding::Undefined => "undefined",
        }
    }
}

/// An arm against the baseline (the first arm) on one metric, seed by seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versus {
    /// The arm.
    pub arm: String,
    /// The baseline.
    pub baseline: String,
    /// Mean over the seeds of `arm − baseline`.
    #[serde(with = "crate::io::json_f64")]
    pub difference: f64,
    /// The 95% interval of `difference` (the paired t's), lower end.
    #[serde(with = "crate::io::json_f64")]
    pub interval_low: f64,
    /// Its upper end.
    #[serde(with = "crate::io::json_f64")]
    pub interval_high: f64,
    /// The two-sided p-value of the paired t-test over the seeds.
    pub p: f64,
    /// `p` after Holm's correction over every comparison of the table.
    pub p_holm: f64,
    /// The level `p_holm` is held to: 5%, or Pocock's per-look level with `looks`.
    pub alpha: f64,
    /// What the comparison found.
    pub finding: Finding,
    /// Inside the noise: the seeds per arm at which the same gap and noise would reach the level
    /// Holm asks of the smallest p-value (`None`: beyond 1000 seeds, or no gap or no noise to
    /// extrapolate from; see `beyond`).
    pub seeds_to_decide: Option<usize>,
    /// The gap is too small for its noise to be decided within 1000 seeds: a tie.
    pub beyond: bool,
}

/// One metric across the arms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricComparison {
    /// The metric (`R@1`, `mAP@R`, `H-AP`, …).
    pub metric: String,
    /// Its label level (0 = finest); `None` for the hierarchical metrics.
    pub level: Option<usize>,
    /// Every arm's values, the baseline first.
    pub arms: Vec<ArmValues>,
    /// Every other arm against the baseline.
    pub versus: Vec<Versus>,
}

/// The recipe of one arm, for the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmRecipe {
    /// The arm.
    pub label: String,
    /// Its resolved recipe (TOML, seed of the first run).
    pub recipe: String,
}

/// Which evaluation of each run a comparison reads.
///
/// ```
/// use rankwise::experiments::compare::Reading;
/// assert_eq!("selected".parse::<Reading>()?, Reading::Selected);
/// assert_eq!(Reading::default(), Reading::Last);
/// assert!("best".parse::<Reading>().is_err());
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reading {
    /// The last evaluation: the test metrics after the last epoch.
    #[default]
    Last,
    /// The test metrics of the epoch each run's held-out training classes selected
    /// ([`crate::train::validation`]): every arm needs a `[validation]` table. The selection
    /// never looks at the test classes, so neither the epoch nor, through it, the comparison is
    /// tuned on them.
    Selected,
}

impl Reading {
    /// The reading as `--at` and the CSV's `at` column write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reading::Last => "last",
            Reading::Selected => "selected",
        }
    }
}

impl FromStr for Reading {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim() {
            "last" => Ok(Reading::Last),
            "selected" => Ok(Reading::Selected),
            other => Err(Error::invalid(
                "--at",
                format!("`{other}`: expected last or selected"),
            )),
        }
    }
}

/// A comparison of arms over seeds: what ran and what it found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedComparison {
    /// The arms, the baseline first.
    pub arms: Vec<ArmRecipe>,
    /// The seeds every arm trained with.
    pub seeds: Vec<u64>,
    /// The seed counts at which these comparisons were read before (group-sequential levels).
    pub looks: Vec<usize>,
    /// The run code of the build that trained the runs.
    pub run_code: String,
    /// The devices the runs trained on.
    pub devices: Vec<String>,
    /// One row per metric.
    pub rows: Vec<MetricComparison>,
    /// Which evaluation of each run was compared.
    #[serde(default)]
    pub reading: Reading,
    /// With [`Reading::Selected`]: the epoch each run's validation selected (`[arm][seed]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selected_epochs: Vec<Vec<u64>>,
}

/// The runs of every arm with every seed (`result[a][s]`), through `runner` (cached runs are
/// read back; up to `jobs` train side by side). Needs two arms with distinct labels and
/// recipes, and two distinct seeds.
pub fn run_arms(
    runner: &Runner,
    arms: &[Arm],
    seeds: &[u64],
    jobs: usize,
) -> Result<Vec<Vec<RunResult>>> {
    check_design(arms, seeds)?;
    let specs: Vec<RunSpec> = arms
        .iter()
        .flat_map(|arm| {
            seeds.iter().map(move |&seed| RunSpec {
                label: format!("{} seed {seed}", arm.label),
                config: TrainConfig {
                    seed,
                    ..arm.config.clone()
                },
            })
        })
        .collect();
    let results = runner.run_many(&specs, jobs)?;
    Ok(results.chunks(seeds.len()).map(<[_]>::to_vec).collect())
}

fn check_design(arms: &[Arm], seeds: &[u64]) -> Result<()> {
    if arms.len() < 2 {
        return Err(Error::invalid(
            "--arm",
            format!(
                "{} arm(s): a comparison needs at least two (the first is the baseline)",
                arms.len()
            ),
        ));
    }
    for (i, a) in arms.iter().enumerate() {
        for b in &arms[..i] {
            if a.label == b.label {
                return Err(Error::invalid(
                    "--arm",
                    format!("two arms are labelled `{}`", a.label),
                ));
            }
            let same = |x: &Arm| {
                TrainConfig {
                    seed: 0,
                    ..x.config.clone()
                }
                .to_toml_string()
            };
            if same(a)? == same(b)? {
                return Err(Error::invalid(
                    "--arm",
                    format!(
                        "arms `{}` and `{}` have the same recipe: they would train the same \
                         runs",
                        b.label, a.label
                    ),
                ));
            }
        }
    }
    // A recipe with folds but no fold stands for all of its folds: only `tune` trains those.
    if let Some(a) = arms.iter().find(|a| {
        a.config
            .validation
            .as_ref()
            .is_some_and(|v| v.cross_validation_folds() > 1)
    }) {
        return Err(Error::invalid(
            "validation.fold",
            format!(
                "arm `{}` cuts its classes into validation.folds but names no fold to hold out: \
                 set validation.fold (rankwise tune cross-validates over every fold)",
                a.label
            ),
        ));
    }
    let mut distinct = seeds.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != seeds.len() || seeds.len() < 2 {
        return Err(Error::invalid(
            "seeds",
            format!(
                "{} seed(s) given, {} distinct: a test over seeds needs at least two distinct \
                 seeds",
                seeds.len(),
                distinct.len()
            ),
        ));
    }
    Ok(())
}

/// The comparison of the runs `runs[a][s]` (arm `a`, `labels[a]`, seed `seeds[s]`) on
/// `metrics`: every arm's values, and every arm against the first by the paired t-test over
/// the seeds ([`stats::compare`], at 5% or Pocock's level over `looks`), Holm-corrected over
/// every comparison of the table (see the module documentation). An error names a run that
/// lacks a metric.
///
/// ```
/// use rankwise::experiments::compare::{compare_runs, Finding};
/// use rankwise::experiments::{MetricValue, RunResult};
/// let run = |label: &str, seed: u64, r1: f64| RunResult {
///     label: label.into(), recipe: String::new(), log: vec![], seconds: 0.0,
///     test_queries: 100, seed, device: "cpu".into(), code: String::new(),
///     metrics: vec![MetricValue { metric: "R@1".into(), level: Some(0), value: r1 }],
/// };
/// let base = vec![run("base", 0, 0.60), run("base", 1, 0.64), run("base", 2, 0.61)];
/// // Each seed 0.02 to 0.03 above its baseline: a gap far outside the seeds' noise.
/// let new = vec![run("new", 0, 0.62), run("new", 1, 0.67), run("new", 2, 0.63)];
/// let rows = compare_runs(&["base".into(), "new".into()], &[0, 1, 2], &[base, new],
///                         &[("R@1".into(), Some(0))], &[])?;
/// let v = &rows[0].versus[0];
/// assert!((v.difference - 0.0233).abs() < 1e-4 && v.p < 0.05);
/// assert_eq!(v.finding, Finding::Higher);
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn compare_runs(
    labels: &[String],
    seeds: &[u64],
    runs: &[Vec<RunResult>],
    metrics: &[(String, Option<usize>)],
    looks: &[usize],
) -> Result<Vec<MetricComparison>> {
    if runs.len() != labels.len() || runs.iter().any(|r| r.len() != seeds.len()) {
        return Err(Error::Shape(format!(
            "{} arms of runs for {} labels, each needing {} seeds",
            runs.len(),
            labels.len(),
            seeds.len()
        )));
    }
    // Every arm's sample of every metric, then every comparison, so that Holm sees them all.
    let mut rows = Vec::with_capacity(metrics.len());
    let mut samples: Vec<Vec<Sample>> = Vec::with_capacity(metrics.len());
    for (metric, level) in metrics {
        let mut arm_samples = Vec::with_capacity(labels.len());
        let mut arms = Vec::with_capacity(labels.len());
        for (label, arm_runs) in labels.iter().zip(runs) {
            let values = arm_runs
                .iter()
                .map(|r| r.metric(metric, *level))
                .collect::<Result<Vec<f64>>>()?;
            let sample = Sample::new(values.clone())
                .with_seeds(seeds.to_vec())
                .with_looks(looks.to_vec());
            arms.push(arm_values(label, sample.clone()));
            arm_samples.push(sample);
        }
        rows.push(MetricComparison {
            metric: metric.clone(),
            level: *level,
            arms,
            versus: Vec::new(),
        });
        samples.push(arm_samples);
    }
    for (row, versus) in rows.iter_mut().zip(versus_baseline(labels, &samples, 0)) {
        row.versus = versus;
    }
    Ok(rows)
}

/// An arm's values, their mean and the half-width of their 95% interval.
pub(crate) fn arm_values(label: &str, sample: Sample) -> ArmValues {
    ArmValues {
        arm: label.to_string(),
        mean: sample.mean(),
        half_width: sample.ci95(),
        values: sample.values,
    }
}

/// Every arm against arm `baseline`, for each metric `m` of `samples[m][arm]` (samples over the
/// same seeds): the paired t-test of each seed's difference, Holm-corrected over every
/// comparison of all the metrics, each with its finding and, inside the noise, the seeds it
/// would need. `result[m]` lists the arms but the baseline, in order.
pub(crate) fn versus_baseline(
    labels: &[String],
    samples: &[Vec<Sample>],
    baseline: usize,
) -> Vec<Vec<Versus>> {
    let mut tests: Vec<(usize, usize, Comparison, Vec<f64>)> = Vec::new();
    for (m, arm_samples) in samples.iter().enumerate() {
        for a in (0..labels.len()).filter(|&a| a != baseline) {
            let c = stats::compare(&arm_samples[a], &arm_samples[baseline]);
            debug_assert_eq!(c.test, Test::PairedSeeds);
            let d: Vec<f64> = arm_samples[a]
                .values
                .iter()
                .zip(&arm_samples[baseline].values)
                .map(|(x, y)| x - y)
                .collect();
            tests.push((m, a, c, d));
        }
    }
    let adjusted = holm(&tests.iter().map(|t| t.2.p).collect::<Vec<_>>());
    let count = tests.len().max(1) as f64;
    let mut out: Vec<Vec<Versus>> = vec![Vec::new(); samples.len()];
    for ((m, a, c, d), p_holm) in tests.into_iter().zip(adjusted) {
        let paired = stats::paired_t(&d);
        let defined = d.iter().all(|x| x.is_finite());
        let finding = if !defined {
            Finding::Undefined
        } else if p_holm < c.level && c.difference > 0.0 {
            Finding::Higher
        } else if p_holm < c.level && c.difference < 0.0 {
            Finding::Lower
        } else {
            Finding::InsideTheNoise
        };
        // Holm's smallest p-value must beat level / comparisons: the level a gap needs to be
        // decided whatever the other comparisons show.
        let (seeds_to_decide, beyond) = match finding {
            Finding::InsideTheNoise => {
                match stats::seeds_to_decide(&samples[m][a], &samples[m][baseline], c.level / count)
                {
                    SeedsToDecide::At(n) => (Some(n), false),
                    SeedsToDecide::Beyond => (None, true),
                    SeedsToDecide::NotApplicable => (None, false),
                }
            }
            _ => (None, false),
        };
        out[m].push(Versus {
            arm: labels[a].clone(),
            baseline: labels[baseline].clone(),
            difference: c.difference,
            interval_low: paired.interval.0,
            interval_high: paired.interval.1,
            p: c.p,
            p_holm,
            alpha: c.level,
            finding,
            seeds_to_decide,
            beyond,
        });
    }
    out
}

/// Trains (or reads back) every arm with every seed and compares them on `metrics` (see
/// [`run_arms`] and [`compare_runs`]), each run read as `reading` says.
pub fn compare(
    runner: &Runner,
    arms: &[Arm],
    seeds: &[u64],
    jobs: usize,
    metrics: &[MetricChoice],
    looks: &[usize],
    reading: Reading,
) -> Result<SeedComparison> {
    check_looks(looks, seeds.len())?;
    check_metric_names(metrics, arms)?;
    check_reading(reading, arms)?;
    let runs = run_arms(runner, arms, seeds, jobs)?;
    let (runs, selected_epochs) = match reading {
        Reading::Last => (runs, Vec::new()),
        Reading::Selected => {
            let read = read_selected(arms, &runs)?;
            let epochs = read
                .iter()
                .map(|arm| arm.iter().map(|(_, epoch)| *epoch).collect())
                .collect();
            let runs = read
                .into_iter()
                .map(|arm| arm.into_iter().map(|(run, _)| run).collect())
                .collect();
            (runs, epochs)
        }
    };
    let measured: Vec<(String, Option<usize>)> = runs[0][0]
        .metrics
        .iter()
        .map(|m| (m.metric.clone(), m.level))
        .collect();
    let keys = resolve_metrics(metrics, &measured)?;
    let labels: Vec<String> = arms.iter().map(|a| a.label.clone()).collect();
    let rows = compare_runs(&labels, seeds, &runs, &keys, looks)?;
    let devices = devices_of(&runs);
    Ok(SeedComparison {
        arms: arms
            .iter()
            .zip(&runs)
            .map(|(a, r)| ArmRecipe {
                label: a.label.clone(),
                recipe: r[0].recipe.clone(),
            })
            .collect(),
        seeds: seeds.to_vec(),
        looks: looks.to_vec(),
        run_code: runner.run_code().to_string(),
        devices,
        rows,
        reading,
        selected_epochs,
    })
}

/// The devices `runs` trained on, each once, sorted.
pub(crate) fn devices_of(runs: &[Vec<RunResult>]) -> Vec<String> {
    let mut devices: Vec<String> = runs.iter().flatten().map(|r| r.device.clone()).collect();
    devices.sort();
    devices.dedup();
    devices
}

/// [`Reading::Selected`] needs every arm to hold classes out for validation: checked before
/// anything trains, naming the arms without.
pub fn check_reading(reading: Reading, arms: &[Arm]) -> Result<()> {
    let without: Vec<&str> = arms
        .iter()
        .filter(|a| a.config.validation.is_none())
        .map(|a| a.label.as_str())
        .collect();
    if reading == Reading::Selected && !without.is_empty() {
        return Err(Error::invalid(
            "--at selected",
            format!(
                "arm(s) {} have no [validation] table to select an epoch with (add one to the \
                 recipe, or --set validation.fraction=0.2 for every arm)",
                without.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Every run read at its selected epoch, with that epoch ([`RunResult::selected`]).
fn read_selected(arms: &[Arm], runs: &[Vec<RunResult>]) -> Result<Vec<Vec<(RunResult, u64)>>> {
    arms.iter()
        .zip(runs)
        .map(|(arm, arm_runs)| {
            let validation = arm.config.validation.as_ref().ok_or_else(|| {
                Error::invalid(
                    "--at selected",
                    format!("arm {} has no [validation]", arm.label),
                )
            })?;
            arm_runs
                .iter()
                .map(|run| run.selected(validation))
                .collect()
        })
        .collect()
}

/// Earlier looks must be increasing seed counts below this one's.
pub fn check_looks(looks: &[usize], seeds: usize) -> Result<()> {
    let increasing = looks.windows(2).all(|w| w[0] < w[1]);
    if !increasing || looks.iter().any(|&l| l < 2 || l >= seeds) {
        return Err(Error::invalid(
            "--looks",
            format!(
                "{looks:?}: the seed counts at which these arms were compared before, increasing, \
                 each at least 2 and below this comparison's {seeds} seeds"
            ),
        ));
    }
    Ok(())
}

/// Writes `comparison` to `path`, atomically: `.json`, the whole comparison (recipes and every
/// seed's value included); `.csv`, one line per metric and arm (`metric,level,arm,n,mean,
/// half_width,baseline,difference,interval_low,interval_high,p,p_holm,alpha,finding,
/// seeds_to_decide`; the baseline's line without the comparison).
pub fn write_comparison(path: &Path, comparison: &SeedComparison) -> Result<()> {
    match ResultFormat::from_path(path)? {
        ResultFormat::Json => write_json(path, comparison),
        ResultFormat::Csv => write_atomically(path, |w| write_csv(w, comparison)),
    }
}

fn write_csv(w: &mut dyn Write, comparison: &SeedComparison) -> std::io::Result<()> {
    let mut out = csv::Writer::from_writer(w);
    out.write_record([
        "metric",
        "level",
        "arm",
        "n",
        "mean",
        "half_width",
        "baseline",
        "difference",
        "interval_low",
        "interval_high",
        "p",
        "p_holm",
        "alpha",
        "finding",
        "seeds_to_decide",
        "at",
    ])?;
    for row in &comparison.rows {
        let level = row.level.map_or(String::new(), |l| l.to_string());
        for arm in &row.arms {
            let mut record = vec![
                row.metric.clone(),
                level.clone(),
                arm.arm.clone(),
                arm.values.len().to_string(),
                csv_f64(arm.mean),
                csv_f64(arm.half_width),
            ];
            match row.versus.iter().find(|v| v.arm == arm.arm) {
                Some(v) => record.extend([
                    v.baseline.clone(),
                    csv_f64(v.difference),
                    csv_f64(v.interval_low),
                    csv_f64(v.interval_high),
                    csv_f64(v.p),
                    csv_f64(v.p_holm),
                    csv_f64(v.alpha),
                    v.finding.as_str().to_string(),
                    seeds_text(v),
                ]),
                None => record.extend(std::iter::repeat_n(String::new(), 9)),
            }
            record.push(comparison.reading.as_str().to_string());
            out.write_record(&record)?;
        }
    }
    out.flush()
}

/// `seeds_to_decide` as a table shows it: the count, `> 1000`, or empty.
pub fn seeds_text(v: &Versus) -> String {
    match (v.seeds_to_decide, v.beyond) {
        (Some(n), _) => n.to_string(),
        (None, true) => format!("> {}", stats::SEEDS_CAP),
        (None, false) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::MetricValue;

    fn run(seed: u64, metrics: &[(&str, Option<usize>, f64)]) -> RunResult {
        RunResult {
            label: String::new(),
            recipe: String::new(),
            metrics: metrics
                .iter()
                .map(|&(m, l, v)| MetricValue {
                    metric: m.into(),
                    level: l,
                    value: v,
                })
                .collect(),
            log: vec![],
            seconds: 0.0,
            test_queries: 10,
            seed,
            device: "cpu".into(),
            code: String::new(),
        }
    }

    fn arm(values: &[f64]) -> Vec<RunResult> {
        values
            .iter()
            .enumerate()
            .map(|(s, &v)| run(s as u64, &[("R@1", Some(0), v), ("H-AP", None, v / 2.0)]))
            .collect()
    }

    #[test]
    fn arm_specs_parse_and_refuse_what_they_cannot_read() {
        let a: ArmSpec = "  base ".parse().unwrap();
        assert_eq!(
            (a.label.as_str(), a.recipe, a.overrides.len()),
            ("base", None, 0)
        );
        let a: ArmSpec = "b: @x.toml; loss.tau=0.1;".parse().unwrap();
        assert_eq!(a.recipe, Some(PathBuf::from("x.toml")));
        assert_eq!(a.overrides, ["loss.tau=0.1"]);
        // A value may hold `:` (the label ends at the first one) and `=`.
        let a: ArmSpec = "hub: pretrained=hf:org/model:w.safetensors"
            .parse()
            .unwrap();
        assert_eq!(a.overrides, ["pretrained=hf:org/model:w.safetensors"]);
        for (text, want) in [
            (": epochs=2", "no label"),
            ("a: epochs", "neither KEY=VALUE nor @FILE"),
            ("a: epochs=2; @x.toml", "must come first"),
            ("a: @", "must come first"),
        ] {
            let e = text.parse::<ArmSpec>().unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("--arm"), "{text}: {e}");
        }
    }

    #[test]
    fn metrics_resolve_to_what_the_runs_measured() {
        let measured: Vec<(String, Option<usize>)> = vec![
            ("H-AP".into(), None),
            ("R@1".into(), Some(0)),
            ("mAP@R".into(), Some(0)),
            ("R@1".into(), Some(1)),
        ];
        let pick = |c: &[&str]| {
            let c: Vec<MetricChoice> = c.iter().map(|s| s.parse().unwrap()).collect();
            resolve_metrics(&c, &measured)
        };
        let got = pick(&["R@1", "H-AP", "R@1:1", "R@1:0"]).unwrap();
        assert_eq!(
            got,
            vec![
                ("R@1".to_string(), Some(0)),
                ("H-AP".to_string(), None),
                ("R@1".to_string(), Some(1))
            ]
        );
        assert_eq!(pick(&["all"]).unwrap(), measured);
        let e = pick(&["NDCG"]).unwrap_err().to_string();
        assert!(
            e.contains("NDCG") && e.contains("H-AP, R@1, mAP@R, R@1"),
            "{e}"
        );
        let e = pick(&["R@1:2"]).unwrap_err().to_string();
        assert!(e.contains("R@1:2") && e.contains("level(s) 0, 1"), "{e}");
    }

    #[test]
    fn holm_is_bonferroni_at_the_smallest_and_monotone() {
        let p = [0.001, 0.2, 0.02, 0.9];
        let h = holm(&p);
        assert_eq!(h[0], 0.004);
        assert!((h[2] - 0.06).abs() < 1e-15);
        assert!((h[1] - 0.4).abs() < 1e-15);
        assert_eq!(h[3], 0.9);
        assert_eq!(holm(&[0.5, 0.6]), vec![1.0, 1.0]);
        assert!(holm(&[]).is_empty());
    }

    #[test]
    fn each_arm_is_tested_seed_by_seed_against_the_first_and_holm_corrected() {
        let seeds = [0, 1, 2, 3];
        let labels: Vec<String> = ["base", "up", "same"].map(String::from).to_vec();
        let base = arm(&[0.60, 0.64, 0.58, 0.62]);
        // +0.02 every seed but one (+0.03): a gap far outside the seeds' noise.
        let up = arm(&[0.62, 0.66, 0.60, 0.65]);
        // Differences +0.01, −0.01, +0.005, −0.004: a gap of about 0 in its noise.
        let same = arm(&[0.61, 0.63, 0.585, 0.616]);
        let keys = vec![("R@1".to_string(), Some(0)), ("H-AP".to_string(), None)];
        let rows = compare_runs(&labels, &seeds, &[base.clone(), up, same], &keys, &[]).unwrap();
        assert_eq!(rows.len(), 2);
        let r1 = &rows[0];
        assert_eq!(r1.arms[0].values, vec![0.60, 0.64, 0.58, 0.62]);
        assert!((r1.arms[0].mean - 0.61).abs() < 1e-12);
        let (up, same) = (&r1.versus[0], &r1.versus[1]);
        // The library's paired test and its interval, unchanged.
        let d = [0.02, 0.02, 0.02, 0.03];
        let t = stats::paired_t(&d);
        assert!((up.p - t.p).abs() < 1e-9 && (up.interval_low - t.interval.0).abs() < 1e-9);
        assert_eq!(
            (up.finding, same.finding),
            (Finding::Higher, Finding::InsideTheNoise)
        );
        assert!(same.seeds_to_decide.is_some() || same.beyond);
        // Holm over the four comparisons (two arms × two metrics): never below p, at most 4p.
        let all: Vec<&Versus> = rows.iter().flat_map(|r| &r.versus).collect();
        assert_eq!(all.len(), 4);
        for v in &all {
            assert!(
                v.p_holm >= v.p && v.p_holm <= (4.0 * v.p).min(1.0) + 1e-15,
                "{v:?}"
            );
            assert_eq!(v.alpha, stats::ALPHA);
        }
        // With earlier looks at 2 and 3 seeds, Pocock's per-look level instead of 5%.
        let rows = compare_runs(
            &labels[..2],
            &seeds,
            &[base.clone(), arm(&[0.62, 0.66, 0.60, 0.65])],
            &keys[..1],
            &[2, 3],
        )
        .unwrap();
        assert!(
            (rows[0].versus[0].alpha - stats::sequential_level(&[2, 3, 4], 0.05)).abs() < 1e-12
        );
        // A run without the metric is an error naming it.
        let mut short = base.clone();
        short[1].label = "base seed 1".into();
        short[1].metrics.truncate(1);
        let e = compare_runs(&labels[..2], &seeds, &[base, short], &keys, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("base seed 1") && e.contains("H-AP"), "{e}");
    }

    #[test]
    fn a_metric_without_a_value_is_undefined_not_a_verdict() {
        let base = arm(&[0.6, 0.7]);
        let nan = arm(&[f64::NAN, 0.7]);
        let rows = compare_runs(
            &["a".into(), "b".into()],
            &[0, 1],
            &[base, nan],
            &[("R@1".into(), Some(0))],
            &[],
        )
        .unwrap();
        assert_eq!(rows[0].versus[0].finding, Finding::Undefined);
    }

    #[test]
    fn looks_must_be_earlier_counts() {
        assert!(check_looks(&[], 3).is_ok());
        assert!(check_looks(&[3, 5], 8).is_ok());
        for bad in [&[5, 3][..], &[8], &[1, 4], &[3, 3]] {
            let e = check_looks(bad, 8).unwrap_err().to_string();
            assert!(e.contains("--looks"), "{e}");
        }
    }
}

//! The pieces every experiment shares: a [`Variant`] (one row of a paper's table: a method or
//! a parameter value, as a change to the base recipe), a [`TableSpec`] (rows × columns, keyed
//! like `paper_tables/published/<paper>.csv`), the [`Measured`] cells of ours that
//! [`crate::report::Comparison`] puts beside the paper's (each the mean over the seeds of its
//! row), and the degenerate rows no claim may count ([`find_degenerate`]).

use super::runs::{RunResult, RunSpec, Runner};
use super::{ExperimentRecipe, Scale};
use crate::error::Result;
use crate::report::{Measured, Provenance, Unit};
use crate::stats::Sample;
use crate::train::TrainConfig;
use std::path::PathBuf;

/// One row of a paper's table as a run: a change to the scale's base recipe.
pub struct Variant {
    /// The method as the paper's table names it (the `method` column of
    /// `paper_tables/published/<paper>.csv`), so that ours lands beside the paper's.
    pub method: String,
    /// The paper's row setting (`tau=0.1`, `batch=128`, `backbone=R50;dim=512`, …) as in the
    /// published CSV, empty if none. It names the paper's row; how our run differs goes in
    /// [`Variant::note`].
    pub setting: String,
    /// How our run differs from the paper's row, if it does (e.g. `ours: batch 32` where the
    /// paper's ablation used 64 — the quick scale halves every batch).
    pub note: String,
    /// Applies the row's loss and parameters to the base recipe.
    pub apply: Box<dyn Fn(&mut TrainConfig)>,
}

impl std::fmt::Debug for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant")
            .field("method", &self.method)
            .field("setting", &self.setting)
            .field("note", &self.note)
            .finish_non_exhaustive()
    }
}

impl Variant {
    /// A row with no swept parameter.
    pub fn new(method: &str, apply: impl Fn(&mut TrainConfig) + 'static) -> Self {
        Variant {
            method: method.into(),
            setting: String::new(),
            note: String::new(),
            apply: Box::new(apply),
        }
    }

    /// A row of a sweep or ablation.
    pub fn with_setting(
        method: &str,
        setting: impl Into<String>,
        apply: impl Fn(&mut TrainConfig) + 'static,
    ) -> Self {
        Variant {
            method: method.into(),
            setting: setting.into(),
            note: String::new(),
            apply: Box::new(apply),
        }
    }

    /// The same row with a note on how our run differs from the paper's.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// The same row with `more` added to its note (after `; `).
    pub fn and_note(mut self, more: &str) -> Self {
        if self.note.is_empty() {
            self.note = more.to_string();
        } else {
            self.note = format!("{}; {more}", self.note);
        }
        self
    }

    /// The run of this row on top of `base` (with `base`'s seed).
    pub fn spec(&self, base: &TrainConfig) -> RunSpec {
        let mut config = base.clone();
        (self.apply)(&mut config);
        let label = row_name(&self.method, &self.setting);
        RunSpec { label, config }
    }

    /// The run of this row on top of `base` with `seed` instead of `base`'s.
    pub fn spec_seeded(&self, base: &TrainConfig, seed: u64) -> RunSpec {
        let mut spec = self.spec(base);
        spec.config.seed = seed;
        spec.label = format!("{} seed {seed}", spec.label);
        spec
    }
}

/// A row's name in run labels, figure legends and notes: `method (setting)`, or `method` alone
/// when the row has no setting.
pub fn row_name(method: &str, setting: &str) -> String {
    if setting.is_empty() {
        method.to_string()
    } else {
        format!("{method} ({setting})")
    }
}

/// How one of our metrics is reported in a paper's column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Column {
    /// The paper's column name (the `metric` of `paper_tables/published/<paper>.csv`).
    pub paper: &'static str,
    /// Our metric name in the evaluation report.
    pub ours: &'static str,
    /// Our label column for binary metrics (0 = finest), `None` for hierarchical ones.
    pub level: Option<usize>,
}

impl Column {
    /// A column whose name is the same in the paper and in our report.
    pub const fn same(name: &'static str, level: Option<usize>) -> Self {
        Column {
            paper: name,
            ours: name,
            level,
        }
    }
}

/// A paper table to reproduce: its rows as runs and its columns as metrics.
#[derive(Debug)]
pub struct TableSpec {
    /// The table's name as in `paper_tables/published/<paper>.csv` (`Table 2`, `Fig. 4a`), so
    /// that our cells join the paper's; a name the paper does not have (`Loss and margin
    /// (ours)`) makes a table of ours only.
    pub name: String,
    /// The paper's dataset column our values stand beside (`SOP`), as in the published CSV.
    /// What really produced them is in each cell's [`Provenance`].
    pub dataset: String,
    /// The rows.
    pub variants: Vec<Variant>,
    /// The columns.
    pub columns: Vec<Column>,
}

/// The runs of one row of one table, one per seed.
#[derive(Debug, Clone)]
pub struct TableRun {
    /// The table.
    pub table: String,
    /// The row's method.
    pub method: String,
    /// The row's setting.
    pub setting: String,
    /// What each seed's run measured, in seed order.
    pub runs: Vec<RunResult>,
}

/// Everything an experiment measured.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    /// Every cell of ours, keyed like the paper's published values (our metrics are fractions,
    /// [`Unit::Fraction`]; the comparison converts them to the paper's unit).
    pub cells: Vec<Measured>,
    /// Every row's runs (a run shared by several rows appears once per row).
    pub runs: Vec<TableRun>,
    /// The rows the claims leave out ([`Measurements::flag_degenerate`]).
    pub degenerate: Vec<Degenerate>,
    /// The seed counts at which the claims' verdicts are read, the current one last
    /// ([`super::SeedCounts::looks`]); [`Measurements::sample`] gives them to every sample, so
    /// that the claims hold each comparison to the level of the design
    /// ([`crate::stats::Sample::with_looks`]). Empty or the current count alone: no earlier
    /// look, the plain 5%.
    pub looks: Vec<usize>,
    /// The paper's printed values keyed like our cells (table, method, dataset, metric,
    /// setting), as fractions ([`Measurements::attach_published`]); [`Measurements::sample`]
    /// gives each sample its row's, so that a claim can carry the paper's gap between two rows
    /// to our scale.
    pub published: std::collections::BTreeMap<crate::report::CellKey, f64>,
}

/// A table row whose run cannot stand for what the row claims to measure, so the paper's
/// claims do not count it (its cells stay in the tables, where a reader can see them).
#[derive(Debug, Clone, PartialEq)]
pub struct Degenerate {
    /// The table.
    pub table: String,
    /// The row's method.
    pub method: String,
    /// The row's setting.
    pub setting: String,
    /// Why: a non-finite value (the run diverged), or every value bit-identical to an earlier
    /// row of the same table (the row's switch changed nothing: the model never moved off its
    /// initial identity map, or the switch never reached the run).
    pub reason: String,
}

impl Degenerate {
    /// `table: method (setting): reason`.
    pub fn describe(&self) -> String {
        let row = row_name(&self.method, &self.setting);
        format!("{}: {row}: {}", self.table, self.reason)
    }
}

/// The degenerate rows of `cells`, in table order (see [`Degenerate`]). Rows of different
/// tables may share a run and so be equal; within a table, the first of equal rows is kept
/// and each later one flagged.
pub fn find_degenerate(cells: &[Measured]) -> Vec<Degenerate> {
    // Each row (table, method, setting) with its (dataset, metric, value bits), sorted.
    type Row = ((String, String, String), Vec<(String, String, u64)>);
    let mut rows: Vec<Row> = Vec::new();
    for c in cells {
        let key = (c.table.clone(), c.method.clone(), c.setting.clone());
        let entry = (c.dataset.clone(), c.metric.clone(), c.value.to_bits());
        match rows.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(entry),
            None => rows.push((key, vec![entry])),
        }
    }
    for (_, values) in rows.iter_mut() {
        values.sort();
    }
    let mut out = Vec::new();
    for (i, ((table, method, setting), values)) in rows.iter().enumerate() {
        let reason = if let Some((_, metric, _)) = values
            .iter()
            .find(|(_, _, bits)| !f64::from_bits(*bits).is_finite())
        {
            format!("its {metric} is not finite (the run diverged)")
        } else if let Some(((_, m, s), _)) = rows[..i]
            .iter()
            .find(|((t, _, _), v)| t == table && v == values)
        {
            let earlier = if s.is_empty() {
                m.clone()
            } else {
                format!("{m} ({s})")
            };
            format!(
                "every value is bit-identical to the row {earlier} (its switch changed nothing)"
            )
        } else {
            continue;
        };
        out.push(Degenerate {
            table: table.clone(),
            method: method.clone(),
            setting: setting.clone(),
            reason,
        });
    }
    out
}

impl Measurements {
    /// The runs (one per seed) of `table`'s row `method` / `setting`.
    pub fn runs_of(&self, table: &str, method: &str, setting: &str) -> Option<&[RunResult]> {
        self.runs
            .iter()
            .find(|r| r.table == table && r.method == method && r.setting == setting)
            .map(|r| r.runs.as_slice())
    }
}

/// Trains (or fetches from the cache) every row of every table of `tables(base)` on the
/// `scale` base recipe of `recipe`, once per seed of [`ExperimentRecipe::seeds`], and collects
/// the cells (the mean over the seeds, each seed's value kept), each with its provenance: the
/// data of the base, `scale`, the recipe in words (plus the row's note on how it differs from
/// the paper's row), the seeds, the device and the code of the runs.
///
/// Runs start seed by seed — every row at the first seed, then every row at the next — so that
/// an interrupted reproduction has cached the tables' first seed before any second; up to
/// [`super::runs::default_jobs`] train side by side ([`Runner::run_many`]).
pub fn run_tables(
    runner: &Runner,
    recipe: &ExperimentRecipe,
    scale: Scale,
    tables: impl FnOnce(&TrainConfig) -> Vec<TableSpec>,
) -> Result<Measurements> {
    let mut base = recipe.base(scale)?;
    // One pretrained backbone for every row and seed, as the papers start every run from the
    // same ImageNet weights.
    let pretrained_by = match recipe.pretraining(scale)? {
        Some(p) => {
            let (weights, by) = pretrained(runner, p)?;
            base.pretrained = Some(weights);
            Some(by)
        }
        None => None,
    };
    let seeds = recipe.seeds(scale)?;
    let tables = tables(&base);
    let variants: Vec<&Variant> = tables.iter().flat_map(|t| &t.variants).collect();
    let base_ref = &base;
    let specs: Vec<RunSpec> = seeds
        .iter()
        .flat_map(|&seed| variants.iter().map(move |v| v.spec_seeded(base_ref, seed)))
        .collect();
    let results = runner.run_many(&specs, super::runs::default_jobs()?)?;
    // `results` is seed-major: row `i` of seed `s` is at `s · rows + i`.
    let mut runs: Vec<Vec<RunResult>> = vec![Vec::with_capacity(seeds.len()); variants.len()];
    for (k, r) in results.into_iter().enumerate() {
        runs[k % variants.len()].push(r);
    }
    let data = data_name(&base);
    let described = match &pretrained_by {
        Some(by) => format!(
            "{}, from a backbone pretrained by {by}",
            describe_recipe(&base)
        ),
        None => describe_recipe(&base),
    };
    let mut out = Measurements::default();
    let rows = tables
        .iter()
        .flat_map(|t| t.variants.iter().map(move |v| (t, v)));
    for ((table, variant), row_runs) in rows.zip(runs) {
        let detail = if variant.note.is_empty() {
            described.clone()
        } else {
            format!("{described}; {}", variant.note)
        };
        let provenance = Provenance::new(data.clone(), scale, detail).with_runs(
            seeds.clone(),
            distinct(row_runs.iter().map(|r| r.device.as_str())),
            &distinct(row_runs.iter().map(|r| r.code.as_str())),
        );
        for c in &table.columns {
            let values = row_runs
                .iter()
                .map(|r| r.metric(c.ours, c.level))
                .collect::<Result<Vec<f64>>>()?;
            out.cells.push(
                Measured::over_seeds(
                    table.name.clone(),
                    variant.method.clone(),
                    table.dataset.clone(),
                    c.paper,
                    values,
                    Unit::Fraction,
                    provenance.clone(),
                )
                .with_setting(variant.setting.clone()),
            );
        }
        out.runs.push(TableRun {
            table: table.name.clone(),
            method: variant.method.clone(),
            setting: variant.setting.clone(),
            runs: row_runs,
        });
    }
    Ok(out)
}

/// The distinct values, in first-seen order, joined with `+` (one value in the usual case).
fn distinct<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for v in values {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.join("+")
}

/// The data a recipe trains and tests on, in words (`embedded shapes`, `sop`, …).
pub fn data_name(config: &TrainConfig) -> String {
    match &config.dataset {
        crate::train::DatasetConfig::Embedded(_) => "embedded shapes".into(),
        other => other.name(),
    }
}

/// A recipe in a few words: backbone, embedding size, epochs, batch.
pub fn describe_recipe(config: &TrainConfig) -> String {
    let backbone = match &config.model.backbone {
        crate::models::BackboneConfig::SmallCnn(c) => format!("small CNN {:?}", c.widths),
        crate::models::BackboneConfig::Resnet(c) => format!("ResNet {:?}", c.depth),
    };
    let sampler = match &config.sampler {
        crate::train::SamplerConfig::MPerClass {
            batch_size,
            samples_per_class,
            ..
        } => format!("batch {batch_size} ({samples_per_class} per class)"),
        crate::train::SamplerConfig::Hierarchical(c) => {
            format!("batch {} (hierarchical)", c.batch_size)
        }
        crate::train::SamplerConfig::FastAp(c) => {
            format!("batch {} (meta-class pairs)", c.batch_size)
        }
    };
    let epochs = match config.epochs {
        1 => "1 epoch".to_string(),
        n => format!("{n} epochs"),
    };
    format!(
        "{backbone}, dim {}, {epochs}, {sampler}",
        config.model.head.dim
    )
}

/// The backbone weights `pretraining` ends with, trained once by `runner` (or read back from its
/// cache, [`Runner::pretrained_backbone`]), and how they were made in a few words
/// ([`describe_pretraining`]) for the captions.
pub fn pretrained(runner: &Runner, pretraining: TrainConfig) -> Result<(PathBuf, String)> {
    let by = describe_pretraining(&pretraining);
    let spec = RunSpec {
        label: format!("pretraining ({by})"),
        config: pretraining,
    };
    Ok((runner.pretrained_backbone(&spec)?, by))
}

/// A pretraining recipe in a few words: its loss, epochs and data (`norm_softmax, 24 epochs
/// on embedded shapes (dataset seed 1, 768 classes × 40 images)`). The embedded data's size is
/// named because it is what sets the backbone apart from the fine-tuning data (the standard
/// protocol of 2026-11-29 pretrains on 4× the images it fine-tunes on).
pub fn describe_pretraining(config: &TrainConfig) -> String {
    let data = match &config.dataset {
        crate::train::DatasetConfig::Embedded(d) => format!(
            "{} (dataset seed {}, {} classes × {} images)",
            data_name(config),
            d.seed,
            d.shapes().num_classes(),
            d.images_per_class
        ),
        _ => data_name(config),
    };
    let epochs = match config.epochs {
        1 => "1 epoch".to_string(),
        n => format!("{n} epochs"),
    };
    format!("{}, {epochs} on {data}", config.loss.name())
}

/// Sets the batch size of an m-per-class sampler (other samplers are left as they are).
pub fn set_batch_size(config: &mut TrainConfig, b: usize) {
    if let crate::train::SamplerConfig::MPerClass { batch_size, .. } = &mut config.sampler {
        *batch_size = b;
    }
}

/// Sets the positives per class `|P|` of an m-per-class sampler.
pub fn set_samples_per_class(config: &mut TrainConfig, m: usize) {
    if let crate::train::SamplerConfig::MPerClass {
        samples_per_class, ..
    } = &mut config.sampler
    {
        *samples_per_class = m;
    }
}

/// The signature of every paper module's `measure`.
pub type MeasureFn = fn(&Runner, &ExperimentRecipe, Scale) -> Result<Measurements>;

impl Measurements {
    /// Flags the degenerate rows ([`find_degenerate`]): [`Measurements::value`] then leaves
    /// them out, so no claim rests on them.
    pub fn flag_degenerate(&mut self) {
        self.degenerate = find_degenerate(&self.cells);
    }

    /// Whether `table`'s row `method` / `setting` was flagged degenerate.
    pub fn is_degenerate(&self, table: &str, method: &str, setting: &str) -> bool {
        self.degenerate
            .iter()
            .any(|d| d.table == table && d.method == method && d.setting == setting)
    }

    /// Our value (the mean over seeds) of `metric` in `table`'s row `method` / `setting`;
    /// `None` if not measured or if the row is degenerate.
    pub fn value(&self, table: &str, method: &str, setting: &str, metric: &str) -> Option<f64> {
        self.cell(table, method, setting, metric).map(|c| c.value)
    }

    /// Our values of `metric` in `table`'s row `method` / `setting`, one per seed, for a
    /// claim; `None` if not measured or if the row is degenerate.
    pub fn sample(&self, table: &str, method: &str, setting: &str, metric: &str) -> Option<Sample> {
        let c = self.cell(table, method, setting, metric)?;
        // The same runs may stand beside several of the paper's datasets (SSR's CUB and CARS
        // columns): each of those columns' printed values belongs to this sample.
        let columns: Vec<&Measured> = self
            .cells
            .iter()
            .filter(|o| {
                o.table == c.table
                    && o.method == c.method
                    && o.setting == c.setting
                    && o.metric == c.metric
                    && o.samples == c.samples
            })
            .collect();
        Some(self.claim_sample(c, &columns))
    }

    /// The paper's printed values (as fractions) of the cells `columns`, with their datasets.
    fn published_of(&self, columns: &[&Measured]) -> Vec<(String, f64)> {
        columns
            .iter()
            .filter_map(|c| {
                let v = *self.published.get(&c.key())?;
                Some((c.dataset.clone(), v))
            })
            .collect()
    }

    /// `c`'s sample with the design's looks and the printed values of `columns`.
    fn claim_sample(&self, c: &Measured, columns: &[&Measured]) -> Sample {
        c.sample()
            .with_looks(self.looks.clone())
            .with_published(self.published_of(columns))
    }

    /// Keeps the paper's printed scores of `published` (percent or fraction, converted to
    /// fractions like our cells) for [`Measurements::sample`]; times, and numbers whose source
    /// the digests doubt ([`crate::report::PublishedRow::is_uncertain`]), are left out.
    pub fn attach_published(&mut self, published: &crate::report::Published) {
        for r in published.rows() {
            if r.is_uncertain() {
                continue;
            }
            let Some(v) = r.unit.convert(r.value, Unit::Fraction) else {
                continue;
            };
            self.published.insert(r.key(), v);
        }
    }

    /// [`Measurements::sample`] of the cell in `dataset`'s column, for a table whose columns
    /// stand beside several of the paper's datasets (HAPPIER's Table 1: iNat-base and
    /// iNat-full); `sample` takes the first dataset's.
    pub fn sample_on(
        &self,
        table: &str,
        dataset: &str,
        method: &str,
        setting: &str,
        metric: &str,
    ) -> Option<Sample> {
        self.cell_on(table, Some(dataset), method, setting, metric)
            .map(|c| self.claim_sample(c, &[c]))
    }

    fn cell(&self, table: &str, method: &str, setting: &str, metric: &str) -> Option<&Measured> {
        self.cell_on(table, None, method, setting, metric)
    }

    /// The first cell of `table`'s row `method` / `setting` in `metric` (and `dataset`'s
    /// column, if given); `None` if not measured or if the row is degenerate.
    fn cell_on(
        &self,
        table: &str,
        dataset: Option<&str>,
        method: &str,
        setting: &str,
        metric: &str,
    ) -> Option<&Measured> {
        if self.is_degenerate(table, method, setting) {
            return None;
        }
        self.cells.iter().find(|c| {
            c.table == table
                && dataset.is_none_or(|d| c.dataset == d)
                && c.method == method
                && c.setting == setting
                && c.metric == metric
        })
    }
}

#[cfg(test)]
mod degenerate_tests {
    use super::*;
    use crate::experiments::claim::{Claim, Verdict};

    #[test]
    fn a_pretraining_is_described_by_its_loss_length_and_data_size() {
        let mut config = TrainConfig {
            epochs: 24,
            ..TrainConfig::default()
        };
        if let crate::train::DatasetConfig::Embedded(d) = &mut config.dataset {
            d.seed = 1;
            d.variants_per_family = 6;
            d.fine_per_variant = 16;
            d.images_per_class = 40;
        } else {
            panic!("the default dataset is the embedded one");
        }
        let text = describe_pretraining(&config);
        assert!(
            text.contains("24 epochs")
                && text.contains("(dataset seed 1, 768 classes × 40 images)"),
            "{text}"
        );
        config.epochs = 1;
        assert!(describe_pretraining(&config).contains(", 1 epoch on "));
    }

    #[test]
    fn diverged_and_unchanged_rows_are_flagged_and_left_out_of_the_claims() {
        let prov = Provenance::new("embedded shapes", Scale::Tiny, "");
        let cell = |table: &str, method: &str, setting: &str, metric: &str, v: f64| {
            Measured::new(table, method, "D", metric, v, Unit::Fraction, prov.clone())
                .with_setting(setting)
        };
        let mut m = Measurements {
            cells: vec![
                cell("T", "Baseline", "", "acc", 0.5),
                cell("T", "Baseline", "", "ci", 0.01),
                cell("T", "SSR", "a=1", "acc", 0.6),
                cell("T", "SSR", "a=1", "ci", 0.01),
                // Same values as the baseline: the switch changed nothing.
                cell("T", "SSR", "a=2", "ci", 0.01),
                cell("T", "SSR", "a=2", "acc", 0.5),
                // Same acc, another ci: a real row.
                cell("T", "SSR", "a=3", "acc", 0.5),
                cell("T", "SSR", "a=3", "ci", 0.02),
                cell("T", "SSR", "a=4", "acc", f64::NAN),
                cell("T", "SSR", "a=4", "ci", 0.02),
                // Another table may repeat a row (a shared run).
                cell("U", "Baseline", "", "acc", 0.5),
                cell("U", "Baseline", "", "ci", 0.01),
            ],
            ..Measurements::default()
        };
        m.flag_degenerate();
        let flagged: Vec<(&str, &str)> = m
            .degenerate
            .iter()
            .map(|d| (d.table.as_str(), d.setting.as_str()))
            .collect();
        assert_eq!(flagged, [("T", "a=2"), ("T", "a=4")]);
        assert!(m.degenerate[0]
            .reason
            .contains("bit-identical to the row Baseline"));
        assert!(m.degenerate[1]
            .describe()
            .contains("T: SSR (a=4): its acc is not finite"));
        assert_eq!(m.value("T", "SSR", "a=2", "acc"), None);
        assert_eq!(m.value("T", "SSR", "a=3", "acc"), Some(0.5));
        assert_eq!(m.value("U", "Baseline", "", "acc"), Some(0.5));
        let c = Claim::greater(
            "a=1 beats a=2",
            crate::experiments::claim::row("a=1", m.sample("T", "SSR", "a=1", "acc")),
            crate::experiments::claim::row("a=2", m.sample("T", "SSR", "a=2", "acc")),
        );
        assert_eq!(c.verdict, Verdict::NotMeasured);
    }

    #[test]
    fn cells_average_the_seeds_and_keep_each_one() {
        let prov = Provenance::new("embedded shapes", Scale::Tiny, "");
        let m = Measurements {
            cells: vec![Measured::over_seeds(
                "T",
                "A",
                "D",
                "R@1",
                vec![0.1, 0.2, 0.3],
                Unit::Fraction,
                prov,
            )],
            ..Measurements::default()
        };
        assert!((m.value("T", "A", "", "R@1").unwrap() - 0.2).abs() < 1e-15);
        assert_eq!(
            m.sample("T", "A", "", "R@1").unwrap().values,
            [0.1, 0.2, 0.3]
        );
        assert_eq!(
            m.sample_on("T", "D", "A", "", "R@1"),
            m.sample("T", "A", "", "R@1")
        );
        assert_eq!(m.sample_on("T", "E", "A", "", "R@1"), None);
    }

    #[test]
    fn samples_carry_the_papers_printed_values_of_their_columns() {
        let prov = Provenance::new("embedded shapes", Scale::Tiny, "");
        let over = |dataset: &str, method: &str, v: Vec<f64>| {
            Measured::over_seeds("T", method, dataset, "R@1", v, Unit::Fraction, prov.clone())
        };
        let mut m = Measurements {
            cells: vec![
                // One set of runs stands beside CUB and CARS; another run beside iNat.
                over("CUB", "A", vec![0.1, 0.2]),
                over("CARS", "A", vec![0.1, 0.2]),
                over("iNat", "A", vec![0.3, 0.4]),
                over("CUB", "B", vec![0.1, 0.1]),
            ],
            ..Measurements::default()
        };
        let published = crate::report::Published::parse(
            std::path::Path::new("p.csv"),
            "table,method,dataset,metric,setting,value,unit,source\n\
             T,A,CUB,R@1,,34.0,percent,x\n\
             T,A,CARS,R@1,,0.5,fraction,x\n\
             T,A,iNat,R@1,,70.0,percent,x\n\
             T,B,CUB,R@1,,30.0,percent,row assignment uncertain\n\
             T,A,CUB,time,,12,ms,x\n",
        )
        .unwrap();
        m.attach_published(&published);
        let a = m.sample("T", "A", "", "R@1").unwrap();
        assert_eq!(
            a.published,
            [("CUB".to_string(), 0.34), ("CARS".to_string(), 0.5)]
        );
        let inat = m.sample_on("T", "iNat", "A", "", "R@1").unwrap();
        assert_eq!(inat.published, [("iNat".to_string(), 0.7)]);
        // A number the digests doubt gives no gap to test against.
        assert!(m.sample("T", "B", "", "R@1").unwrap().published.is_empty());
        assert_eq!(m.published.len(), 3);
    }
}

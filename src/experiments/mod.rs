//! The experiments of the five papers: each sub-module builds the runs that one paper's tables
//! compare from a recipe of `configs/experiments/`, trains them (through a caching [`Runner`]),
//! and returns our measurements beside the paper's published values, as polars tables, plus the
//! figures.
//!
//! Every recipe has three scales ([`Scale`]): `tiny` (seconds, for CI), `quick` (the embedded
//! dataset, the small CNN, CPU, minutes) and `paper` (the paper's dataset, backbone, batch size,
//! epochs and optimizer, for a user with the data and a GPU). What a table varies (the loss, τ,
//! the batch size, …) is code, mirroring the paper's table; everything else comes from the
//! recipe.

pub mod claim;
pub mod compare;
pub mod convergence;
pub mod experiment;
pub mod notebook;
pub mod publish;
pub mod recipe;
pub mod runs;
pub mod search;
pub mod summary;
pub mod table;
pub mod tune;

// Parts of one paper's experiments that are not a table of runs.
pub mod minibatch_ap;
pub mod ranking_cost;
pub mod ssr_features;

// The papers: every file here that defines `pub const EXPERIMENT` (an [`Experiment`]) is
// declared as a module and listed in `REGISTRY` by build.rs, so that adding a paper touches no
// file but its own (and its recipe, published values and notebook). Those modules are outside
// rustfmt's reach through `include!`; `scripts/test.sh` checks their formatting by name.
include!(concat!(env!("OUT_DIR"), "/papers.rs"));

pub use claim::{Claim, Verdict};
pub use experiment::{find, keys, Context, Experiment, TrainedPaper};
pub use publish::{write_paper, Figure, PaperResults, ReproducedTable};
pub use recipe::{scale_from_env, ExperimentRecipe, Scale, SeedCounts};
pub use runs::{MetricValue, RunResult, RunSpec, Runner};
pub use table::{Degenerate, Measurements, Variant};

use crate::report::Published;

use crate::error::{Error, Result};
use std::path::Path;

/// Runs one paper's experiments at `scale` (recipe from `configs/experiments/` under `root`)
/// and checks its qualitative claims on our numbers; `paper` is a key or name of
/// [`REGISTRY`].
pub fn measure_paper(
    paper: &str,
    root: &Path,
    runner: &Runner,
    scale: Scale,
) -> Result<(Measurements, Vec<Claim>)> {
    measure_paper_with(paper, root, runner, scale, "")
}

/// [`measure_paper`] with `changes`, TOML merged over the paper's recipe file
/// ([`recipe::merge_toml`]).
pub fn measure_paper_with(
    paper: &str,
    root: &Path,
    runner: &Runner,
    scale: Scale,
    changes: &str,
) -> Result<(Measurements, Vec<Claim>)> {
    let experiment = find(paper)?;
    let published = published_values(root, experiment)?;
    measure_experiment(experiment, root, runner, scale, changes, &published)
}

/// The paper's published values, `root/paper_tables/published/<key>.csv`.
fn published_values(root: &Path, experiment: &dyn Experiment) -> Result<Published> {
    Published::for_key(
        root.join("paper_tables").join("published"),
        experiment.key(),
    )
}

/// [`measure_paper_with`] of a found experiment, its published values read: the claims see
/// the paper's printed values of each row ([`Measurements::attach_published`]).
fn measure_experiment(
    experiment: &dyn Experiment,
    root: &Path,
    runner: &Runner,
    scale: Scale,
    changes: &str,
    published: &Published,
) -> Result<(Measurements, Vec<Claim>)> {
    let cx = Context {
        root,
        runner,
        scale,
        changes,
    };
    let mut m = experiment.measure(&cx)?;
    m.flag_degenerate();
    m.attach_published(published);
    let claims = experiment.claims(&cx, &m)?;
    Ok((m, claims))
}

/// Runs one paper's experiments at `scale` and assembles what a reader needs: the claims, every
/// table joined with the paper's values of `root/paper_tables/published/<paper>.csv`, and the
/// figures. Runs come from `runner`'s cache when it has them.
pub fn reproduce_paper(
    paper: &str,
    root: &Path,
    runner: &Runner,
    scale: Scale,
) -> Result<PaperResults> {
    reproduce_paper_with(paper, root, runner, scale, "")
}

/// [`reproduce_paper`] with `changes`, TOML merged over the paper's recipe file; the results'
/// commit then says that the recipe was changed, since the file at that commit no longer
/// describes the runs.
pub fn reproduce_paper_with(
    paper: &str,
    root: &Path,
    runner: &Runner,
    scale: Scale,
    changes: &str,
) -> Result<PaperResults> {
    let experiment = find(paper)?;
    let published = published_values(root, experiment)?;
    let (measurements, claims) =
        measure_experiment(experiment, root, runner, scale, changes, &published)?;
    let tables = publish::comparisons(experiment.name(), &published, &measurements)?;
    let figures = experiment.figures(&measurements, &tables)?;
    Ok(PaperResults {
        key: experiment.key(),
        name: experiment.name(),
        scale,
        measurements,
        claims,
        tables,
        figures,
        commit: crate::report::git_commit(root).map(|c| {
            if !recipe::has_changes(changes) {
                c
            } else {
                format!("{c} with recipe changes")
            }
        }),
    })
}

/// Writes our cells as CSV (`table,method,dataset,metric,setting,value,ci95,n,samples,unit,
/// our_data,scale,seeds,device,run_code,detail`: the key of the paper's value it stands beside,
/// then ours — the mean, its 95% half-width (empty for one value), how many values and, for
/// seeded runs, each one (`;`-separated) — and where it comes from) and the claims as Markdown, atomically: `<dir>/<paper>_<scale>.csv` and
/// `<dir>/<paper>_<scale>_claims.md`.
pub fn write_measurements(
    dir: &Path,
    paper: &str,
    scale: Scale,
    m: &Measurements,
    claims: &[Claim],
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let csv_path = dir.join(format!("{paper}_{scale}.csv"));
    crate::io::write_atomically(&csv_path, |w| {
        let mut out = csv::Writer::from_writer(w);
        out.write_record([
            "table", "method", "dataset", "metric", "setting", "value", "ci95", "n", "samples",
            "unit", "our_data", "scale", "seeds", "device", "run_code", "detail",
        ])?;
        let joined = |v: Vec<String>| v.join(";");
        for c in &m.cells {
            let sample = c.sample();
            let ci = sample.ci95();
            // Each seed's value (each seed's mean for values on test units); not the thousands
            // of SSR's per-episode or per-query values of a single seed.
            let per_seed = match &sample.units {
                Some(u) => u.replicates() >= 2,
                None => !c.provenance.seeds.is_empty(),
            };
            out.write_record([
                c.table.as_str(),
                &c.method,
                &c.dataset,
                &c.metric,
                &c.setting,
                &format!("{}", c.value),
                &if ci.is_finite() {
                    format!("{ci}")
                } else {
                    String::new()
                },
                &sample.n().to_string(),
                &if per_seed {
                    joined(sample.replicates().iter().map(|v| format!("{v}")).collect())
                } else {
                    String::new()
                },
                c.unit.as_str(),
                &c.provenance.dataset,
                c.provenance.scale.as_str(),
                &joined(c.provenance.seeds.iter().map(u64::to_string).collect()),
                &c.provenance.device,
                &c.provenance.code,
                &c.provenance.detail,
            ])?;
        }
        out.flush()
    })?;
    summary::write_claims_csv(&dir.join(format!("{paper}_{scale}_claims.csv")), claims)?;
    let md_path = dir.join(format!("{paper}_{scale}_claims.md"));
    let md = format!(
        "# {paper}: the paper's claims at the `{scale}` scale\n\n{}",
        claim::claims_markdown(claims, m)
    );
    crate::io::write_atomically(&md_path, |w| w.write_all(md.as_bytes()))
}

/// Where [`reproduce`] reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReproduceDirs {
    /// The repository root: `configs/experiments/` and `paper_tables/published/` are read there.
    pub root: std::path::PathBuf,
    /// Tables (`<paper>.md`, `<paper>/<table>.{csv,md}`, `measured/`).
    pub tables: std::path::PathBuf,
    /// Figures (`<paper>_*.{png,svg}`).
    pub figures: std::path::PathBuf,
    /// The run cache (`None`: no cache).
    pub runs: Option<std::path::PathBuf>,
    /// The run codes whose cached runs are read back, each run from the first that has it
    /// ([`Runner::reading_runs_of`]: the committed `standard` runs re-read by a build whose
    /// training code has changed since), training none unless this build's code is among them;
    /// empty: this build's, and missing runs train.
    pub runs_of: Vec<String>,
}

impl ReproduceDirs {
    /// The default folders under `root` for `scale`: `paper_tables/` and `figures/` at the
    /// quick and paper scales, `paper_tables/standard/` and `figures/standard/` at the standard
    /// scale (its tables sit beside the quick ones, never over them), or, at the `tiny` scale
    /// (numbers meaningless), `target/reproduce-tiny/{paper_tables,figures}` so the committed
    /// tables are never overwritten; runs cached in `target/rankwise-runs/<scale>/`.
    pub fn defaults(root: &Path, scale: Scale) -> Self {
        let (tables, figures) = match scale {
            Scale::Tiny => {
                let base = root.join("target").join("reproduce-tiny");
                (base.join("paper_tables"), base.join("figures"))
            }
            Scale::Standard => (
                root.join("paper_tables").join("standard"),
                root.join("figures").join("standard"),
            ),
            Scale::Quick | Scale::Paper => (root.join("paper_tables"), root.join("figures")),
        };
        ReproduceDirs {
            root: root.to_path_buf(),
            tables,
            figures,
            runs: Some(
                root.join("target")
                    .join("rankwise-runs")
                    .join(scale.as_str()),
            ),
            runs_of: Vec::new(),
        }
    }
}

/// Regenerates the tables and figures of `papers` (all of [`REGISTRY`] when empty) at `scale`:
/// [`reproduce_paper`] then [`write_paper`] for each, printing the claims and the files written
/// to `out`; then the README's verdict table of `scale` ([`summary::update_readme`]) when the
/// tables went to `paper_tables/`. What `rankwise reproduce` and `examples/reproduce.rs` run.
pub fn reproduce(
    papers: &[String],
    scale: Scale,
    dirs: &ReproduceDirs,
    verbose: bool,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    // Reject an unknown paper before any training.
    let experiments: Vec<&dyn Experiment> = if papers.is_empty() {
        REGISTRY.to_vec()
    } else {
        papers.iter().map(|p| find(p)).collect::<Result<_>>()?
    };
    let recipes = dirs.root.join("configs").join("experiments");
    if !recipes.is_dir() {
        return Err(Error::file(
            &recipes,
            "no experiment recipes here: run from the repository root or give its path",
        ));
    }
    let mut runner = Runner::new(dirs.runs.clone(), verbose);
    for code in &dirs.runs_of {
        runner = runner.reading_runs_of(code)?;
    }
    let io = |e: std::io::Error| Error::invalid("output", e.to_string());
    for experiment in experiments {
        let paper = experiment.key();
        let codes = runner.run_codes().join(", then ");
        let how = if runner.reads_this_build_only() {
            "runs not in the cache train now, one line each".to_string()
        } else if runner.trains() {
            format!("the runs of run codes {codes} read back, those none has trained now")
        } else {
            format!("the runs of run code {codes} read back, none trained")
        };
        writeln!(out, "== {paper} ({scale}) — {how}").map_err(io)?;
        let r = reproduce_paper(paper, &dirs.root, &runner, scale)?;
        let (page, figures) = write_paper(&dirs.tables, &dirs.figures, &r)?;
        for c in &r.claims {
            writeln!(out, "  {}: {} ({})", c.claim, c.verdict(), c.evidence).map_err(io)?;
        }
        writeln!(out, "  tables: {}", page.display()).map_err(io)?;
        for f in figures {
            writeln!(out, "  figure: {}", f.display()).map_err(io)?;
        }
    }
    if update_committed_readme(&dirs.root, &dirs.tables, scale)? {
        writeln!(out, "  README: the `{scale}` verdict table rewritten").map_err(io)?;
    }
    Ok(())
}

/// Rewrites the README's verdict table of `scale` ([`summary::update_readme`]) from the claims
/// under `tables`, when those are the repository's committed tables of that scale (only they
/// feed it, never a scratch folder or the tiny scale); `Ok(true)` when it was rewritten. Called
/// after [`reproduce`] and after a notebook's run ([`notebook::run_paper`]), so that the
/// README's table reads the verdicts the main job just computed.
pub fn update_committed_readme(root: &Path, tables: &Path, scale: Scale) -> Result<bool> {
    let readme = root.join("README.md");
    let committed = tables == ReproduceDirs::defaults(root, scale).tables && scale != Scale::Tiny;
    let link = tables
        .strip_prefix(root)
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .unwrap_or_default();
    Ok(committed && readme.exists() && summary::update_readme(&readme, tables, scale, &link)?)
}

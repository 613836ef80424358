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

pub mod notebook;
pub mod publish;
pub mod recipe;
pub mod runs;
pub mod table;

pub mod fastap;
pub mod happier;
pub mod rambo;
pub mod smooth_ap;
pub mod ssr;
pub mod ssr_features;

pub use publish::{write_paper, Figure, PaperResults, ReproducedTable};
pub use recipe::{scale_from_env, ExperimentRecipe, Scale};
pub use runs::{MetricValue, RunResult, RunSpec, Runner};
pub use table::{Claim, Measurements, Variant};

use crate::report::{Paper, Published};

use crate::error::{Error, Result};
use std::path::Path;

/// The papers whose experiments are implemented, by key (`configs/experiments/<key>.toml`).
pub const PAPERS: [&str; 5] = [
    smooth_ap::PAPER,
    fastap::PAPER,
    rambo::PAPER,
    happier::PAPER,
    ssr::PAPER,
];

/// Runs one paper's experiments at `scale` (recipe from `configs/experiments/` under `root`)
/// and checks its qualitative claims on our numbers. SSR trains no network through `runner`
/// (its backbone and meta-training run in [`ssr::measure`], uncached).
pub fn measure_paper(
    paper: &str,
    root: &Path,
    runner: &Runner,
    scale: Scale,
) -> Result<(Measurements, Vec<Claim>)> {
    if paper == ssr::PAPER {
        let m = ssr::measure(root, scale)?;
        let c = ssr::claims(&m);
        return Ok((m, c));
    }
    let recipe = ExperimentRecipe::for_paper(root, paper)?;
    Ok(match paper {
        smooth_ap::PAPER => {
            let m = smooth_ap::measure(runner, &recipe, scale)?;
            let c = smooth_ap::claims(&m);
            (m, c)
        }
        fastap::PAPER => {
            let m = fastap::measure(runner, &recipe, scale)?;
            let c = fastap::claims(&m, &recipe.base(scale)?);
            (m, c)
        }
        rambo::PAPER => {
            let m = rambo::measure(runner, &recipe, scale)?;
            let c = rambo::claims(&m);
            (m, c)
        }
        happier::PAPER => {
            let m = happier::measure(runner, &recipe, scale)?;
            let c = happier::claims(&m);
            (m, c)
        }
        other => {
            return Err(Error::invalid(
                "paper",
                format!("`{other}`: expected one of {}", PAPERS.join(", ")),
            ))
        }
    })
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
    let which: Paper = paper.parse()?;
    let (measurements, claims) = measure_paper(paper, root, runner, scale)?;
    let published = Published::for_paper(root.join("paper_tables").join("published"), which)?;
    let tables = publish::comparisons(which, &published, &measurements)?;
    let figures = match which {
        Paper::SmoothAp => smooth_ap::figures(&measurements, &tables)?,
        Paper::FastAp => fastap::figures(&measurements, &tables)?,
        Paper::Rambo => rambo::figures(&measurements, &tables)?,
        Paper::Happier => happier::figures(&measurements, &tables)?,
        Paper::Ssr => ssr::figures(&measurements)?,
    };
    Ok(PaperResults {
        paper: which,
        scale,
        measurements,
        claims,
        tables,
        figures,
    })
}

/// Writes our cells as CSV (`table,method,dataset,metric,setting,value,unit,our_data,scale,detail`:
/// the key of the paper's value it stands beside, then ours and where it comes from) and the
/// claims as Markdown, atomically: `<dir>/<paper>_<scale>.csv` and
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
            "table", "method", "dataset", "metric", "setting", "value", "unit", "our_data",
            "scale", "detail",
        ])?;
        for c in &m.cells {
            out.write_record([
                c.table.as_str(),
                &c.method,
                &c.dataset,
                &c.metric,
                &c.setting,
                &format!("{}", c.value),
                c.unit.as_str(),
                &c.provenance.dataset,
                c.provenance.scale.as_str(),
                &c.provenance.detail,
            ])?;
        }
        out.flush()
    })?;
    let md_path = dir.join(format!("{paper}_{scale}_claims.md"));
    let mut md = format!(
        "# {paper}: the paper's claims at the `{scale}` scale\n\n| claim | verdict | our numbers |\n|---|---|---|\n"
    );
    for c in claims {
        // A `|` inside a cell (e.g. "|P|") would end it.
        let cell = |t: &str| t.replace('|', "\\|");
        md.push_str(&format!(
            "| {} | {} | {} |\n",
            cell(&c.claim),
            c.verdict(),
            cell(&c.evidence)
        ));
    }
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
}

impl ReproduceDirs {
    /// The default folders under `root` for `scale`: `paper_tables/` and `figures/`, or, at the
    /// `tiny` scale (numbers meaningless), `target/reproduce-tiny/{paper_tables,figures}` so the
    /// committed tables are never overwritten; runs cached in `target/rankwise-runs/<scale>/`.
    pub fn defaults(root: &Path, scale: Scale) -> Self {
        let (tables, figures) = if scale == Scale::Tiny {
            let base = root.join("target").join("reproduce-tiny");
            (base.join("paper_tables"), base.join("figures"))
        } else {
            (root.join("paper_tables"), root.join("figures"))
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
        }
    }
}

/// Regenerates the tables and figures of `papers` (all of [`PAPERS`] when empty) at `scale`:
/// [`reproduce_paper`] then [`write_paper`] for each, printing the claims and the files written
/// to `out`. What `rankwise reproduce` and `examples/reproduce.rs` run.
pub fn reproduce(
    papers: &[String],
    scale: Scale,
    dirs: &ReproduceDirs,
    verbose: bool,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let all: Vec<String> = PAPERS.iter().map(|p| p.to_string()).collect();
    let papers = if papers.is_empty() { &all[..] } else { papers };
    // Reject an unknown paper before any training.
    for paper in papers {
        if !PAPERS.contains(&paper.as_str()) {
            return Err(Error::invalid(
                "paper",
                format!("`{paper}`: expected one of {}", PAPERS.join(", ")),
            ));
        }
    }
    let recipes = dirs.root.join("configs").join("experiments");
    if !recipes.is_dir() {
        return Err(Error::file(
            &recipes,
            "no experiment recipes here: run from the repository root or give its path",
        ));
    }
    let runner = Runner::new(dirs.runs.clone(), verbose);
    let io = |e: std::io::Error| Error::invalid("output", e.to_string());
    for paper in papers {
        writeln!(
            out,
            "== {paper} ({scale}) — runs not in the cache train now, one line each"
        )
        .map_err(io)?;
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
    Ok(())
}

//! What the paper notebooks call: one function that runs a paper's experiments and writes its
//! tables and figures ([`run_paper`]), and the functions that show the results inline in an
//! evcxr (Rust Jupyter) notebook. Keeping this here, tested, lets each notebook stay a few
//! lines: setup, one call, the tables, the figures, the reading.

use super::publish::{write_paper, PaperResults};
use super::runs::Runner;
use super::Scale;
use crate::error::{Error, Result};
use crate::report::{evcxr_display, markdown_table, SettingPlacement};
use std::path::PathBuf;

/// Where a notebook run reads and writes.
#[derive(Debug, Clone, PartialEq)]
pub struct NotebookPaths {
    /// The repository root (recipes under `configs/experiments/`, the published values under
    /// `paper_tables/published/`).
    pub root: PathBuf,
    /// Where `paper_tables/` and `figures/` are written.
    pub output: PathBuf,
    /// The run cache (`target/rankwise-runs/<scale>/` of the repository, shared with
    /// `cargo run --example reproduce`, so a notebook does not retrain what the CLI trained).
    pub cache: PathBuf,
}

impl NotebookPaths {
    /// The paths of a notebook run: `root` is this crate's folder (a notebook depends on
    /// rankwise by path, so that is the repository it was opened in); the output folder is
    /// `RANKWISE_OUTPUT_DIR` (set by `scripts/run_notebooks.sh`) or the repository root.
    pub fn from_env(scale: Scale) -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let output = match std::env::var("RANKWISE_OUTPUT_DIR") {
            Ok(dir) if !dir.trim().is_empty() => PathBuf::from(dir),
            _ => root.clone(),
        };
        Self::new(root, output, scale)
    }

    /// Explicit paths; the cache is `root/target/rankwise-runs/<scale>`.
    pub fn new(root: PathBuf, output: PathBuf, scale: Scale) -> Self {
        let cache = root
            .join("target")
            .join("rankwise-runs")
            .join(scale.as_str());
        Self {
            root,
            output,
            cache,
        }
    }
}

/// Runs `paper`'s experiments at `scale` (cached runs are reused, the others train now, one
/// progress line each; the allocator is tuned first, [`crate::cpu::alloc::tune_allocator`]) and
/// writes `paper_tables/<paper>.md`, the per-table CSV/Markdown and the figures under
/// `paths.output` (`paper_tables/standard/` and `figures/standard/` at the standard scale).
/// Returns the results for the notebook to show.
pub fn run_paper(paper: &str, scale: Scale, paths: &NotebookPaths) -> Result<PaperResults> {
    run_paper_with(paper, scale, paths, "")
}

/// [`run_paper`] with `changes`: TOML merged over `configs/experiments/<paper>.toml` before
/// the rows run (a table merges key by key, any other value replaces the file's), e.g.
/// `"[quick]\nepochs = 8"`. The notebooks' recipe cell: rows whose resolved recipe changed
/// train, the others come from the run cache; the tables' commit says "with recipe changes".
pub fn run_paper_with(
    paper: &str,
    scale: Scale,
    paths: &NotebookPaths,
    changes: &str,
) -> Result<PaperResults> {
    // The notebooks train on the CPU like `rankwise reproduce`: keep freed tensor buffers for
    // reuse (×1.74 on the small CNN, benches/train_throughput_vs_torch.md).
    crate::cpu::alloc::tune_allocator();
    let runner = Runner::new(Some(paths.cache.clone()), true);
    let results = super::reproduce_paper_with(paper, &paths.root, &runner, scale, changes)?;
    // Where `rankwise reproduce` writes the same scale (the standard tables sit beside the
    // quick ones).
    let (mut tables, mut figures_dir) = (
        paths.output.join("paper_tables"),
        paths.output.join("figures"),
    );
    if scale == Scale::Standard {
        tables.push("standard");
        figures_dir.push("standard");
    }
    let (page, figures) = write_paper(&tables, &figures_dir, &results)?;
    println!("wrote {}", page.display());
    for f in figures {
        println!("wrote {}", f.display());
    }
    // The main job: the README's verdict table follows the tables just written (not for a
    // changed recipe, whose verdicts the committed README should not show).
    if !super::recipe::has_changes(changes)
        && super::update_committed_readme(&paths.root, &tables, scale)?
    {
        println!("wrote the README's `{scale}` verdict table");
    }
    Ok(results)
}

/// The recipe file a paper notebook runs (`configs/experiments/<paper>.toml` under the
/// repository root), then each shared file one of its `[pretraining.<scale>]` sections
/// `extends` ([`super::recipe::Pretraining`]), as Markdown for the notebook to show: the whole
/// recipe the runs resolve, not a pointer to part of it.
pub fn recipe_markdown(paper: &str, paths: &NotebookPaths) -> Result<String> {
    let key = super::find(paper)?.key();
    let path = super::recipe::recipe_path(&paths.root, key);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let mut markdown = format!(
        "`configs/experiments/{key}.toml`:\n\n```toml\n{}\n```\n",
        text.trim_end()
    );
    let recipe: toml::Table =
        toml::from_str(&text).map_err(|e| Error::file(&path, e.to_string()))?;
    for (name, file) in super::recipe::extended_files(&path, &recipe) {
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
        markdown.push_str(&format!(
            "\nwhich `extends` `configs/experiments/{name}`:\n\n```toml\n{}\n```\n",
            text.trim_end()
        ));
    }
    Ok(markdown)
}

/// Shows [`recipe_markdown`] inline in evcxr (printed as text elsewhere).
pub fn show_recipe(paper: &str, paths: &NotebookPaths) -> Result<()> {
    display_markdown(&recipe_markdown(paper, paths)?);
    Ok(())
}

/// The Markdown of one reproduced table (caption with the scale and provenance of ours, then
/// `paper / ours` cells shaped like the paper's table); an error naming the tables that exist
/// if `table` is not one of them.
pub fn table_markdown(results: &PaperResults, table: &str) -> Result<String> {
    let comparison = results.table(table).ok_or_else(|| {
        let names: Vec<&str> = results.tables.iter().map(|t| t.table.as_str()).collect();
        Error::invalid(
            "table",
            format!(
                "{} has no reproduced table {table:?}; it has {}",
                results.name,
                names.join(", ")
            ),
        )
    })?;
    markdown_table(
        &comparison.paper_shaped(SettingPlacement::Rows)?,
        &comparison.caption(),
    )
}

/// Prints `markdown` between evcxr's content markers, so that Jupyter renders it.
fn display_markdown(markdown: &str) {
    println!("EVCXR_BEGIN_CONTENT text/markdown\n{markdown}\nEVCXR_END_CONTENT");
}

/// Shows one reproduced table inline ([`table_markdown`]).
pub fn show_table(results: &PaperResults, table: &str) -> Result<()> {
    display_markdown(&table_markdown(results, table)?);
    Ok(())
}

/// Shows every reproduced table of the paper inline, in order.
pub fn show_tables(results: &PaperResults) -> Result<()> {
    for t in &results.tables {
        show_table(results, &t.table)?;
    }
    Ok(())
}

/// Shows the paper's claims, checked on our numbers, inline.
pub fn show_claims(results: &PaperResults) {
    display_markdown(&format!(
        "### {}: the paper's claims on our numbers (`{}` scale)\n\n{}",
        results.name,
        results.scale,
        results.claims_markdown()
    ));
}

/// The notebook's reading of the results, generated from the verdicts (never typed): what the
/// runs were (data, scale, seeds, device, run code, commit), then the claims that hold, those
/// contradicted, those inside the noise and those not measured, each with its numbers, and the
/// degenerate runs left out.
pub fn reading(results: &PaperResults) -> String {
    use super::claim::Verdict;
    let mut out = String::from("### Reading (generated from the verdicts)\n\n");
    let cells = &results.measurements.cells;
    let seeded = cells.iter().find(|c| !c.provenance.seeds.is_empty());
    let runs = match seeded.or(cells.first()) {
        Some(c) => {
            let p = &c.provenance;
            let seeds = match p.seeds.len() {
                0 => "one run of each row (the noise is that of its test episodes or queries)"
                    .to_string(),
                1 => "one seed per row (no noise estimate: no claim can be decided)".to_string(),
                n => format!("{n} seeds per row"),
            };
            let device = if p.device.is_empty() {
                "cpu"
            } else {
                &p.device
            };
            format!(
                "Our runs: {} at the `{}` scale, {seeds}, device {device}{}; tables written at \
                 commit `{}`.",
                p.dataset,
                results.scale,
                if p.code.is_empty() {
                    String::new()
                } else {
                    format!(", run code `{}`", p.code)
                },
                results.commit.as_deref().unwrap_or("unknown"),
            )
        }
        None => "Nothing of ours was measured.".to_string(),
    };
    out.push_str(&runs);
    out.push_str(match results.scale {
        super::Scale::Tiny => {
            " At the `tiny` scale the runs last seconds: the verdicts only show that the \
             pipeline works, they say nothing of the paper.\n\n"
        }
        super::Scale::Quick | super::Scale::Standard => {
            " The data are not the paper's: a verdict is about the ordering or effect the paper \
             states (its gaps carried to our scale), not its values.\n\n"
        }
        super::Scale::Paper => "\n\n",
    });
    let groups = [
        (Verdict::Holds, "Holds beyond the noise"),
        (
            Verdict::Contradicted,
            "Contradicted beyond the noise (the order reversed, or the paper's gap ruled out)",
        ),
        (
            Verdict::Inconclusive,
            "Inconclusive: the gaps are inside the noise",
        ),
        (Verdict::NotMeasured, "Not measured"),
    ];
    for (verdict, title) in groups {
        let claims: Vec<_> = results
            .claims
            .iter()
            .filter(|c| c.verdict == verdict)
            .collect();
        if claims.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "**{title}** ({} of {}):\n\n",
            claims.len(),
            results.claims.len()
        ));
        for c in claims {
            out.push_str(&format!("- {} — {}\n", c.claim, c.evidence));
        }
        out.push('\n');
    }
    if let Some(c) = super::convergence::describe(&results.measurements) {
        out.push_str(&format!("{c}\n\n"));
    }
    if !results.measurements.degenerate.is_empty() {
        out.push_str("**Degenerate runs** (left out of every claim):\n\n");
        for d in &results.measurements.degenerate {
            out.push_str(&format!("- {}\n", d.describe()));
        }
    }
    out
}

/// Shows [`reading`] inline.
pub fn show_reading(results: &PaperResults) {
    display_markdown(&reading(results));
}

/// Shows the figure with file stem `stem` inline (SVG); an error naming the figures that exist
/// otherwise.
pub fn show_figure(results: &PaperResults, stem: &str) -> Result<()> {
    let chart = results.figure(stem).ok_or_else(|| {
        let names: Vec<&str> = results.figures.iter().map(|f| f.stem.as_str()).collect();
        Error::invalid(
            "figure",
            format!(
                "{} has no figure {stem:?}; it has {}",
                results.name,
                names.join(", ")
            ),
        )
    })?;
    evcxr_display(chart)
}

/// Shows every figure of the paper inline, in order.
pub fn show_figures(results: &PaperResults) -> Result<()> {
    for f in &results.figures {
        evcxr_display(&f.chart)?;
    }
    Ok(())
}

/// Checks what a notebook promises its reader: every table has at least one value of ours,
/// every value of ours is finite, and every figure was drawn. An error naming the first table
/// or figure that fails.
pub fn check_results(results: &PaperResults) -> Result<()> {
    if results.tables.is_empty() {
        return Err(Error::invalid(
            "results",
            format!("{}: no table was reproduced", results.name),
        ));
    }
    for t in &results.tables {
        let ours: Vec<f64> = t.comparison.rows().iter().filter_map(|r| r.ours).collect();
        if ours.is_empty() {
            return Err(Error::invalid(
                "results",
                format!("{} {}: no value of ours", results.name, t.table),
            ));
        }
        if let Some(v) = ours.iter().find(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "results",
                format!("{} {}: a value of ours is {v}", results.name, t.table),
            ));
        }
    }
    for f in &results.figures {
        f.chart.validate()?;
    }
    Ok(())
}

//! From an experiment's measurements to what a reader looks at: each reproduced table with the
//! paper's published values beside ours ([`comparisons`]), the figures ([`figures`](crate::report::figures)), and the
//! files under `paper_tables/` and `figures/` ([`write_paper`]).

use super::claim::Claim;
use super::table::Measurements;
use super::Scale;
use crate::error::{Error, Result};
use crate::report::{
    line_chart, markdown_table, Comparison, IntervalStyle, LineChart, Marker, Published, Series,
    SeriesStyle, SettingPlacement, Sweep,
};
use std::path::{Path, PathBuf};

/// One reproduced table: its name in the published CSV and the joined values.
#[derive(Debug, Clone)]
pub struct ReproducedTable {
    /// The table's name (`Table 2`, `Fig. 4a`, `Batch size (ours)`).
    pub table: String,
    /// Paper and ours side by side (every published value of the table is kept, reproduced or
    /// not).
    pub comparison: Comparison,
}

/// One figure of an experiment: a file stem (`smooth_ap_tau`) and the chart.
#[derive(Debug, Clone)]
pub struct Figure {
    /// File stem under `figures/`.
    pub stem: String,
    /// The chart.
    pub chart: LineChart,
}

/// The tables our cells belong to, in order of first appearance.
fn table_names(m: &Measurements) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for c in &m.cells {
        if !names.contains(&c.table) {
            names.push(c.table.clone());
        }
    }
    names
}

/// Every table of `m` joined with the paper's published values of the same table
/// ([`Comparison::build`]; a table the paper does not have shows ours only); `paper` is the
/// paper's name, for the titles.
pub fn comparisons(
    paper: &str,
    published: &Published,
    m: &Measurements,
) -> Result<Vec<ReproducedTable>> {
    table_names(m)
        .into_iter()
        .map(|table| {
            let cells: Vec<_> = m
                .cells
                .iter()
                .filter(|c| c.table == table)
                .cloned()
                .collect();
            let comparison =
                Comparison::build(format!("{paper} {table}"), &published.table(&table), &cells)?;
            Ok(ReproducedTable { table, comparison })
        })
        .collect()
}

/// `Table 5 tau` → `table_5_tau`, `Fig. 4a` → `fig_4a`, `Σ…` kept out of file names.
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for ch in name.chars() {
        if ch.is_ascii_alphanumeric() {
            out.push(ch.to_ascii_lowercase());
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
    }
    out.trim_end_matches('_').to_string()
}

/// Our test-set curve of `metric` (at label `level`) over the epochs for every row of `table`,
/// one line per row (epoch 0 = before training when the recipe evaluates at the start): the
/// mean over the row's seeds, in a band of its 95% interval when there are several.
///
/// Errors when no row of `table` logged the metric.
pub fn training_curves(
    m: &Measurements,
    table: &str,
    metric: &str,
    level: Option<usize>,
    title: &str,
) -> Result<LineChart> {
    let mut series = Vec::new();
    for r in m.runs.iter().filter(|r| r.table == table) {
        let curves: Vec<Vec<(u64, f64)>> =
            r.runs.iter().map(|run| run.curve(metric, level)).collect();
        let Some(first) = curves.first().filter(|c| !c.is_empty()) else {
            continue;
        };
        // Every seed logs the same epochs (one recipe); average epoch by epoch.
        let mut points = Vec::with_capacity(first.len());
        let mut half_widths = Vec::with_capacity(first.len());
        for (i, &(epoch, _)) in first.iter().enumerate() {
            let values: Vec<f64> = curves
                .iter()
                .filter_map(|c| c.get(i).filter(|(e, _)| *e == epoch).map(|p| p.1))
                .collect();
            let sample = crate::stats::Sample::new(values);
            points.push((epoch as f64, sample.mean()));
            half_widths.push(sample.ci95());
        }
        let name = super::table::row_name(&r.method, &r.setting);
        let mut line =
            Series::line(name, points).styled(SeriesStyle::LineAndMarkers(Marker::Circle));
        if half_widths.iter().all(|h| h.is_finite()) {
            line = line.with_intervals(half_widths, IntervalStyle::Band);
        }
        series.push(line);
    }
    if series.is_empty() {
        return Err(Error::invalid(
            "training curves",
            format!("no run of {table:?} logged the test {metric} (level {level:?})"),
        ));
    }
    Ok(LineChart::new(title, "epoch", metric, series))
}

/// A sweep over setting `key` of `table`'s rows for `metric`: the paper's values on
/// `paper_dataset` (markers) and ours (a line).
pub fn sweep_of(
    tables: &[ReproducedTable],
    table: &str,
    metric: &str,
    paper_dataset: &str,
    key: &str,
) -> Result<Sweep> {
    let t = tables
        .iter()
        .find(|t| t.table == table)
        .ok_or_else(|| Error::invalid("sweep", format!("table {table:?} was not reproduced")))?;
    let rows = t
        .comparison
        .rows()
        .iter()
        .filter(|r| r.metric == metric && r.paper_dataset == paper_dataset);
    Sweep::from_rows(metric, rows, key)
}

/// Everything one paper's experiments produced at one scale.
#[derive(Debug, Clone)]
pub struct PaperResults {
    /// The paper's key ([`super::Experiment::key`]).
    pub key: &'static str,
    /// The paper's name ([`super::Experiment::name`]).
    pub name: &'static str,
    /// The scale of our runs.
    pub scale: Scale,
    /// Our cells and runs.
    pub measurements: Measurements,
    /// The paper's qualitative claims, checked on our numbers.
    pub claims: Vec<Claim>,
    /// Each reproduced table, paper / ours.
    pub tables: Vec<ReproducedTable>,
    /// The figures.
    pub figures: Vec<Figure>,
    /// The commit of the code that wrote the tables ([`crate::report::git_commit`]), if known.
    pub commit: Option<String>,
}

impl PaperResults {
    /// The reproduced table named `table` (as in the published CSV), if it was run.
    pub fn table(&self, table: &str) -> Option<&Comparison> {
        self.tables
            .iter()
            .find(|t| t.table == table)
            .map(|t| &t.comparison)
    }

    /// The figure with file stem `stem`, if drawn.
    pub fn figure(&self, stem: &str) -> Option<&LineChart> {
        self.figures
            .iter()
            .find(|f| f.stem == stem)
            .map(|f| &f.chart)
    }

    /// The claims as a Markdown table, then the degenerate rows they leave out.
    pub fn claims_markdown(&self) -> String {
        super::claim::claims_markdown(&self.claims, &self.measurements)
    }
}

/// Writes one paper's results:
///
/// - `tables_dir/<paper>/<table>.{csv,md}`: each table, paper / ours ([`Comparison::write`]);
/// - `tables_dir/<paper>.md`: all of them in one page, with the claims and the figures;
/// - `tables_dir/measured/<paper>_<scale>.csv` and `…_claims.md`: our cells and the claims
///   ([`super::write_measurements`]);
/// - `figures_dir/<stem>.{png,svg}`: the figures.
///
/// Everything is written atomically. Returns the path of the summary page and of each figure's
/// PNG.
pub fn write_paper(
    tables_dir: &Path,
    figures_dir: &Path,
    r: &PaperResults,
) -> Result<(PathBuf, Vec<PathBuf>)> {
    let (key, scale) = (r.key, r.scale);
    super::write_measurements(
        &tables_dir.join("measured"),
        key,
        scale,
        &r.measurements,
        &r.claims,
    )?;
    let paper_dir = tables_dir.join(key);
    let commit = r.commit.as_deref().unwrap_or("unknown");
    let mut page = format!(
        "# {}: paper vs ours (`{scale}` scale)\n\nGenerated by `rankwise::experiments` \
         (`cargo run --release -- reproduce --scale {scale} {}`) at commit `{commit}`; the \
         paper's values come from `paper_tables/published/{}.csv`. Each cell reads `paper / \
         ours`; ours were measured on the data and recipe named under each table (with the \
         seeds, device and run code of its runs), which at the `quick` scale is *not* the \
         paper's dataset: compare orderings and effects, not absolute values.\n\n",
        r.name, key, key
    );
    for t in &r.tables {
        let stem = slug(&t.table);
        t.comparison
            .write(&paper_dir, &stem, SettingPlacement::Rows)?;
        page.push_str(&markdown_table(
            &t.comparison.paper_shaped(SettingPlacement::Rows)?,
            &t.comparison.caption(),
        )?);
        page.push_str(&format!(
            "\n(CSV: [`{0}/{stem}.csv`]({0}/{stem}.csv))\n\n",
            key
        ));
    }
    page.push_str("## The paper's claims on our numbers\n\n");
    page.push_str(&r.claims_markdown());
    let mut written = Vec::new();
    if !r.figures.is_empty() {
        page.push_str("\n## Figures\n\n");
    }
    for f in &r.figures {
        let files = line_chart(&f.chart, figures_dir, &f.stem)?;
        let rel = relative_to(&files.png, tables_dir);
        page.push_str(&format!("![{}]({rel})\n\n", f.chart.title));
        written.push(files.png);
    }
    let page_path = tables_dir.join(format!("{key}.md"));
    crate::io::write_atomically(&page_path, |w| w.write_all(page.as_bytes()))?;
    Ok((page_path, written))
}

/// `path` relative to `dir` when both live under the same parent (`../figures/x.png` from
/// `paper_tables/`), otherwise `path` as given.
fn relative_to(path: &Path, dir: &Path) -> String {
    match (dir.parent(), path.strip_prefix(dir.parent().unwrap_or(dir))) {
        (Some(_), Ok(rel)) => format!("../{}", rel.display()),
        _ => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_plain_file_names() {
        assert_eq!(slug("Table 5 tau"), "table_5_tau");
        assert_eq!(slug("Fig. 4a"), "fig_4a");
        assert_eq!(slug("Loss and margin (ours)"), "loss_and_margin_ours");
        assert_eq!(slug("Table 3 right"), "table_3_right");
    }

    #[test]
    fn figure_links_are_relative_to_the_tables() {
        let rel = relative_to(
            Path::new("/r/figures/smooth_ap_tau.png"),
            Path::new("/r/paper_tables"),
        );
        assert_eq!(rel, "../figures/smooth_ap_tau.png");
    }
}

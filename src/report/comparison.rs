//! The paper's published values beside ours.
//!
//! An experiment produces [`Measured`] rows keyed like the published ones (table, method,
//! dataset column, metric, setting); [`Comparison::build`] joins them with the
//! [`PublishedRow`]s of the same key. Nothing is dropped: a published value we did not
//! reproduce stays with `ours` null ([`Status::PaperOnly`]), and a measured value with no
//! published counterpart (a method the paper did not run, a mistyped key) stays with `paper`
//! null ([`Status::OursOnly`]), so a typo shows in the table instead of vanishing.
//!
//! Two views: [`Comparison::to_dataframe`], one row per value (`method | setting | metric |
//! paper | paper_dataset | ours | our_dataset | scale | …`), and
//! [`Comparison::paper_shaped`], shaped like the paper's table (rows = methods, columns =
//! dataset × metric, cells `paper / ours`).

use super::provenance::Provenance;
use super::published::{check_setting, CellKey, PublishedRow, Unit};
use super::tables::{csv_text, markdown_table, write_text_pair, TableFiles};
use crate::error::{Error, Result};
use polars::prelude::{Column, DataFrame};
use std::collections::HashMap;
use std::path::Path;

/// One of our values, to be put beside the paper's value of the same key.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The paper's table it reproduces, e.g. `Table 2` (as in the published CSV).
    pub table: String,
    /// Row label, as in the published CSV (e.g. `Smooth-AP`).
    pub method: String,
    /// The paper's dataset column this value stands beside (e.g. `SOP`). The data that really
    /// produced it is [`Provenance::dataset`].
    pub dataset: String,
    /// Metric column, as in the published CSV (e.g. `R@1`).
    pub metric: String,
    /// Swept/ablated parameters, `key=value;…`, as in the published CSV, or empty.
    pub setting: String,
    /// Our value: the mean of [`Measured::samples`].
    pub value: f64,
    /// The value of each seed (one entry for a single run), in `unit`; or of each shared test
    /// unit when `units` is set.
    pub samples: Vec<f64>,
    /// `Some` when `samples` holds one value per shared test unit (SSR's episodes or queries),
    /// so that claims pair rows unit by unit ([`crate::stats::compare`]).
    pub units: Option<crate::stats::Units>,
    /// Its unit (our metrics are fractions; the comparison converts to the paper's unit).
    pub unit: Unit,
    /// The data, scale and run that produced it.
    pub provenance: Provenance,
}

impl Measured {
    /// A measured value without a setting; see [`Measured::with_setting`].
    pub fn new(
        table: impl Into<String>,
        method: impl Into<String>,
        dataset: impl Into<String>,
        metric: impl Into<String>,
        value: f64,
        unit: Unit,
        provenance: Provenance,
    ) -> Self {
        Measured {
            table: table.into(),
            method: method.into(),
            dataset: dataset.into(),
            metric: metric.into(),
            setting: String::new(),
            value,
            samples: vec![value],
            units: None,
            unit,
            provenance,
        }
    }

    /// A value measured over several seeds: `value` is their mean, and tables show the 95%
    /// interval of the mean beside it ([`crate::stats::Sample`]).
    pub fn over_seeds(
        table: impl Into<String>,
        method: impl Into<String>,
        dataset: impl Into<String>,
        metric: impl Into<String>,
        samples: Vec<f64>,
        unit: Unit,
        provenance: Provenance,
    ) -> Self {
        let value = samples.iter().sum::<f64>() / samples.len() as f64;
        Measured {
            samples,
            ..Measured::new(table, method, dataset, metric, value, unit, provenance)
        }
    }

    /// The seeds (or test units) as a sample (mean, spread, 95% interval); one value per seed
    /// of [`Provenance::seeds`] carries its seed, so that rows run with the same seeds are
    /// compared seed by seed ([`crate::stats::Sample::with_seeds`]).
    pub fn sample(&self) -> crate::stats::Sample {
        use crate::stats::Sample;
        match &self.units {
            Some(u) => Sample::on_units(self.samples.clone(), u.clone()),
            None => Sample::new(self.samples.clone()).with_seeds(self.provenance.seeds.clone()),
        }
    }

    /// The same cell with `samples` as its values (seeds or repeats), its value their mean.
    pub fn with_samples(mut self, samples: Vec<f64>) -> Self {
        self.value = samples.iter().sum::<f64>() / samples.len() as f64;
        self.samples = samples;
        self
    }

    /// The same value with one value per shared test unit of `units` as its samples.
    pub fn on_units(mut self, samples: Vec<f64>, units: crate::stats::Units) -> Self {
        self.samples = samples;
        self.units = Some(units);
        self
    }

    /// The same value with `setting` (`key=value;…`).
    pub fn with_setting(mut self, setting: impl Into<String>) -> Self {
        self.setting = setting.into();
        self
    }

    /// The key of the paper's value this one stands beside.
    pub fn key(&self) -> CellKey {
        super::published::cell_key(
            &self.table,
            &self.method,
            &self.dataset,
            &self.metric,
            &self.setting,
        )
    }

    fn describe(&self) -> String {
        format!(
            "{} / {} / {} / {} / {:?}",
            self.table, self.method, self.dataset, self.metric, self.setting
        )
    }
}

/// Which sides of a comparison row hold a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Paper and ours.
    Both,
    /// Published, not reproduced (yet).
    PaperOnly,
    /// Measured, with no published value of the same key.
    OursOnly,
}

impl Status {
    /// `both`, `paper only`, `ours only`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Both => "both",
            Status::PaperOnly => "paper only",
            Status::OursOnly => "ours only",
        }
    }
}

/// One joined row.
#[derive(Debug, Clone, PartialEq)]
pub struct ComparisonRow {
    /// The paper's table.
    pub table: String,
    /// Row label.
    pub method: String,
    /// `key=value;…` or empty.
    pub setting: String,
    /// Metric column.
    pub metric: String,
    /// The unit of `paper` and `ours`: the paper's (ours converted to it), or ours when there is
    /// no published value.
    pub unit: Unit,
    /// The published value.
    pub paper: Option<f64>,
    /// The published value as printed.
    pub paper_printed: Option<String>,
    /// The paper's dataset column (the join key; set on both sides).
    pub paper_dataset: String,
    /// Our value, in `unit` (the mean over seeds).
    pub ours: Option<f64>,
    /// The half-width of the 95% interval of our mean, in `unit` (`None` with one seed).
    pub ours_ci95: Option<f64>,
    /// How many values `ours` averages — seeds, or the test episodes of a few-shot row
    /// (0 when not measured).
    pub ours_n: usize,
    /// Where ours comes from.
    pub provenance: Option<Provenance>,
    /// The published row's source (and doubts).
    pub source: Option<String>,
    /// Which sides are present.
    pub status: Status,
}

/// Where the `setting` goes in the paper-shaped view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SettingPlacement {
    /// One row per (method, setting), as in an ablation table (`Smooth-AP tau=0.1`) or
    /// SSR Table 2's backbones.
    #[default]
    Rows,
    /// One column per (dataset, metric, setting), as in SSR Table 1's feature columns.
    Columns,
}

/// Published and measured values of one table, joined.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Caption title, e.g. `Smooth-AP Table 2: SOP, Recall@K`.
    pub title: String,
    rows: Vec<ComparisonRow>,
}

impl Comparison {
    /// Joins `published` and `measured` on (table, method, dataset, metric, setting).
    ///
    /// Published rows keep their order; measured rows without a published counterpart follow,
    /// in their order. Our values are converted to the paper's unit (fraction → percent,
    /// s → ms). Errors name the measured row: a non-finite value (never written silently), a
    /// malformed setting, the same key measured twice, or a unit that cannot be converted to the
    /// paper's (a time beside a score).
    pub fn build(
        title: impl Into<String>,
        published: &[&PublishedRow],
        measured: &[Measured],
    ) -> Result<Self> {
        let mut by_key: HashMap<CellKey, usize> = HashMap::new();
        for (i, m) in measured.iter().enumerate() {
            if !m.value.is_finite() {
                return Err(Error::invalid(
                    "measured value",
                    format!("{} is {}", m.describe(), m.value),
                ));
            }
            check_setting(&m.setting).map_err(|msg| {
                Error::invalid("measured setting", format!("{}: {msg}", m.describe()))
            })?;
            if by_key.insert(m.key(), i).is_some() {
                return Err(Error::invalid(
                    "measured",
                    format!("{} is measured twice", m.describe()),
                ));
            }
        }
        let mut used = vec![false; measured.len()];
        let mut rows = Vec::with_capacity(published.len() + measured.len());
        for p in published {
            let ours = by_key.get(&p.key()).map(|&i| {
                used[i] = true;
                &measured[i]
            });
            let value = match ours {
                Some(m) => Some(m.unit.convert(m.value, p.unit).ok_or_else(|| {
                    Error::invalid(
                        "measured unit",
                        format!(
                            "{} is in {} but the paper prints {} ({}:{})",
                            m.describe(),
                            m.unit,
                            p.unit,
                            p.source,
                            p.line
                        ),
                    )
                })?),
                None => None,
            };
            rows.push(ComparisonRow {
                table: p.table.clone(),
                method: p.method.clone(),
                setting: p.setting.clone(),
                metric: p.metric.clone(),
                unit: p.unit,
                paper: Some(p.value),
                paper_printed: Some(p.printed.clone()),
                paper_dataset: p.dataset.clone(),
                ours: value,
                ours_ci95: ours.and_then(|m| interval(m, p.unit)),
                ours_n: ours.map_or(0, |m| m.sample().n()),
                provenance: ours.map(|m| m.provenance.clone()),
                source: Some(p.source.clone()),
                status: if ours.is_some() {
                    Status::Both
                } else {
                    Status::PaperOnly
                },
            });
        }
        // A value of ours with no published counterpart is shown in the unit the paper prints
        // the same metric in (in this table), so that a column does not mix 0.25 and 25.0; a
        // metric the paper's table lacks (our R@1 beside its mAP@R) takes the table's unit when
        // the table has one and ours converts to it.
        let common_unit = |metric: Option<&str>| -> Option<Unit> {
            let mut units = published
                .iter()
                .filter(|p| metric.is_none_or(|m| p.metric == m))
                .map(|p| p.unit);
            let first = units.next()?;
            units.all(|u| u == first).then_some(first)
        };
        for (m, _) in measured.iter().zip(&used).filter(|(_, &u)| !u) {
            let in_unit = |u: Unit| m.unit.convert(m.value, u).map(|v| (u, v));
            let (unit, value) = match common_unit(Some(&m.metric))
                .and_then(in_unit)
                .or_else(|| common_unit(None).and_then(in_unit))
            {
                Some((u, v)) => (u, v),
                None => (m.unit, m.value),
            };
            rows.push(ComparisonRow {
                table: m.table.clone(),
                method: m.method.clone(),
                setting: m.setting.clone(),
                metric: m.metric.clone(),
                unit,
                paper: None,
                paper_printed: None,
                paper_dataset: m.dataset.clone(),
                ours: Some(value),
                ours_ci95: interval(m, unit),
                ours_n: m.sample().n(),
                provenance: Some(m.provenance.clone()),
                source: None,
                status: Status::OursOnly,
            });
        }
        Ok(Comparison {
            title: title.into(),
            rows,
        })
    }

    /// The joined rows.
    pub fn rows(&self) -> &[ComparisonRow] {
        &self.rows
    }

    /// The distinct provenances of our values, in row order.
    pub fn provenances(&self) -> Vec<&Provenance> {
        let mut out: Vec<&Provenance> = Vec::new();
        for p in self.rows.iter().filter_map(|r| r.provenance.as_ref()) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }

    /// One row per value: `table | method | setting | metric | unit | paper | paper_dataset |
    /// ours | ours_ci95 | ours_n | our_dataset | scale | our_detail | source | status` (nulls
    /// where a side is
    /// missing).
    pub fn to_dataframe(&self) -> Result<DataFrame> {
        let r = &self.rows;
        let text = |f: &dyn Fn(&ComparisonRow) -> String| r.iter().map(f).collect::<Vec<_>>();
        let opt = |f: &dyn Fn(&ComparisonRow) -> Option<String>| {
            r.iter().map(f).collect::<Vec<Option<String>>>()
        };
        let prov = |f: &dyn Fn(&Provenance) -> String| {
            r.iter()
                .map(|x| x.provenance.as_ref().map(f))
                .collect::<Vec<Option<String>>>()
        };
        let columns = vec![
            Column::new("table".into(), text(&|x| x.table.clone())),
            Column::new("method".into(), text(&|x| x.method.clone())),
            Column::new("setting".into(), text(&|x| x.setting.clone())),
            Column::new("metric".into(), text(&|x| x.metric.clone())),
            Column::new("unit".into(), text(&|x| x.unit.to_string())),
            Column::new(
                "paper".into(),
                r.iter().map(|x| x.paper).collect::<Vec<_>>(),
            ),
            Column::new("paper_dataset".into(), text(&|x| x.paper_dataset.clone())),
            Column::new("ours".into(), r.iter().map(|x| x.ours).collect::<Vec<_>>()),
            Column::new(
                "ours_ci95".into(),
                r.iter().map(|x| x.ours_ci95).collect::<Vec<_>>(),
            ),
            Column::new(
                "ours_n".into(),
                r.iter().map(|x| x.ours_n as u32).collect::<Vec<_>>(),
            ),
            Column::new("our_dataset".into(), prov(&|p| p.dataset.clone())),
            Column::new("scale".into(), prov(&|p| p.scale.to_string())),
            Column::new("our_detail".into(), prov(&|p| p.detail.clone())),
            Column::new("source".into(), opt(&|x| x.source.clone())),
            Column::new("status".into(), text(&|x| x.status.as_str().to_string())),
        ];
        DataFrame::new(r.len(), columns)
            .map_err(|e| Error::invalid("comparison", format!("cannot build the table: {e}")))
    }

    /// The table shaped like the paper's: one row per method (and setting, with
    /// [`SettingPlacement::Rows`]), one column per dataset × metric (× setting, with
    /// [`SettingPlacement::Columns`]), both in order of first appearance; each cell
    /// `paper / ours` with ours rounded to the paper's printed decimals, `–` for a missing side,
    /// and an empty cell where neither exists. A `?` after the paper value marks a value the
    /// source calls uncertain or garbled.
    pub fn paper_shaped(&self, placement: SettingPlacement) -> Result<DataFrame> {
        let mut row_keys: Vec<(String, String)> = Vec::new();
        let mut col_keys: Vec<String> = Vec::new();
        let mut cells: HashMap<(usize, usize), String> = HashMap::new();
        for r in &self.rows {
            let (row_key, col_key) = match placement {
                SettingPlacement::Rows => (
                    (r.method.clone(), r.setting.clone()),
                    column_label(&r.paper_dataset, &r.metric, ""),
                ),
                SettingPlacement::Columns => (
                    (r.method.clone(), String::new()),
                    column_label(&r.paper_dataset, &r.metric, &r.setting),
                ),
            };
            let i = index_of(&mut row_keys, row_key);
            let j = index_of(&mut col_keys, col_key.clone());
            let cell = cell_text(r);
            if cells.insert((i, j), cell).is_some() {
                let (m, s) = &row_keys[i];
                return Err(Error::invalid(
                    "comparison",
                    format!(
                        "two values for method {m:?} (setting {s:?}) in column {col_key:?}; \
                         split the comparison by table or place settings in columns"
                    ),
                ));
            }
        }
        let show_setting =
            placement == SettingPlacement::Rows && row_keys.iter().any(|(_, s)| !s.is_empty());
        let n = row_keys.len();
        let mut columns = vec![Column::new(
            "method".into(),
            row_keys.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
        )];
        if show_setting {
            columns.push(Column::new(
                "setting".into(),
                row_keys.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>(),
            ));
        }
        for (j, name) in col_keys.iter().enumerate() {
            let values: Vec<String> = (0..n)
                .map(|i| cells.get(&(i, j)).cloned().unwrap_or_default())
                .collect();
            columns.push(Column::new(name.as_str().into(), values));
        }
        DataFrame::new(n, columns)
            .map_err(|e| Error::invalid("comparison", format!("cannot build the table: {e}")))
    }

    /// The Markdown caption: the title, how to read a cell, and the provenance and scale of our
    /// values (one line each), or a note that nothing was measured.
    pub fn caption(&self) -> String {
        let mut out = format!("### {}\n\nCells: paper / ours", self.title);
        let units: Vec<Unit> = self.rows.iter().fold(Vec::new(), |mut acc, r| {
            if !acc.contains(&r.unit) {
                acc.push(r.unit);
            }
            acc
        });
        if let [unit] = units.as_slice() {
            out.push_str(&format!(" ({unit})"));
        }
        out.push_str(". `?` marks a published value the digests call uncertain or garbled.");
        if self.rows.iter().any(|r| r.ours_n >= 2) {
            out.push_str(
                " Ours: a mean ± the half-width of its 95% interval (Student's t, n − 1 degrees \
                 of freedom) over its samples: the seeds named below, or for SSR the seeds' \
                 means over the shared test episodes or queries (over the episodes or queries \
                 themselves for one seed); a value without ± is one run.",
            );
        }
        out.push('\n');
        let provs = self.provenances();
        if provs.is_empty() {
            out.push_str("\nOurs: not measured yet.\n");
        } else {
            let scales: Vec<&str> = provs.iter().fold(Vec::new(), |mut acc, p| {
                if !acc.contains(&p.scale.as_str()) {
                    acc.push(p.scale.as_str());
                }
                acc
            });
            let scales: Vec<String> = scales.iter().map(|s| format!("`{s}`")).collect();
            out.push_str(&format!("\nScale of ours: {}.\n", scales.join(", ")));
            for p in provs {
                out.push_str(&format!("\n- Ours: {}", p.describe()));
            }
            out.push('\n');
        }
        out
    }

    /// Writes `dir/stem.csv` (one row per value, [`Comparison::to_dataframe`]) and
    /// `dir/stem.md` (the caption with scale and provenance, then the paper-shaped table),
    /// atomically.
    pub fn write(&self, dir: &Path, stem: &str, placement: SettingPlacement) -> Result<TableFiles> {
        let csv = csv_text(&self.to_dataframe()?)?;
        let md = markdown_table(&self.paper_shaped(placement)?, &self.caption())?;
        write_text_pair(dir, stem, &csv, &md)
    }
}

/// The 95% half-width of `m`'s mean in unit `to` (every conversion is a scale factor), `None`
/// with fewer than two seeds.
fn interval(m: &Measured, to: Unit) -> Option<f64> {
    let ci = m.sample().ci95();
    ci.is_finite().then(|| m.unit.convert(ci, to)).flatten()
}

fn index_of<T: PartialEq>(keys: &mut Vec<T>, key: T) -> usize {
    match keys.iter().position(|k| *k == key) {
        Some(i) => i,
        None => {
            keys.push(key);
            keys.len() - 1
        }
    }
}

fn column_label(dataset: &str, metric: &str, setting: &str) -> String {
    let mut s = if dataset.is_empty() {
        metric.to_string()
    } else {
        format!("{dataset} {metric}")
    };
    if !setting.is_empty() {
        s.push_str(&format!(" [{setting}]"));
    }
    s
}

/// `paper / ours` with ours at the paper's printed precision.
fn cell_text(r: &ComparisonRow) -> String {
    let decimals = r
        .paper_printed
        .as_deref()
        .and_then(|p| p.split_once('.').map(|(_, f)| f.len()))
        .unwrap_or(match r.unit {
            Unit::Percent => 1,
            Unit::Fraction => 3,
            Unit::Milliseconds | Unit::Seconds => 2,
        });
    let doubtful = r.source.as_deref().is_some_and(|s| {
        let s = s.to_ascii_lowercase();
        s.contains("uncertain") || s.contains("garbled")
    });
    let paper = match &r.paper_printed {
        Some(p) if doubtful => format!("{p}?"),
        Some(p) => p.clone(),
        None => "–".to_string(),
    };
    let ours = match (r.ours, r.ours_ci95) {
        (None, _) => "–".to_string(),
        (Some(v), None) => format!("{v:.decimals$}"),
        (Some(v), Some(ci)) => format!("{v:.decimals$} ± {ci:.decimals$}"),
    };
    format!("{paper} / {ours}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::published::Published;

    fn published() -> Published {
        Published::parse(
            Path::new("p.csv"),
            "table,method,dataset,metric,setting,value,unit,source\n\
             Table 2,Margin,SOP,R@1,,72.7,percent,T2\n\
             Table 2,Smooth-AP,SOP,R@1,batch=224,79.2,percent,T2\n\
             Table 2,Smooth-AP,SOP,R@10,batch=224,91.0,percent,T2 uncertain\n",
        )
        .unwrap()
    }

    fn quick() -> Provenance {
        Provenance::new("embedded shapes", "quick", "small CNN, 5 epochs")
    }

    fn measured(method: &str, metric: &str, value: f64) -> Measured {
        Measured::new(
            "Table 2",
            method,
            "SOP",
            metric,
            value,
            Unit::Fraction,
            quick(),
        )
        .with_setting("batch=224")
    }

    #[test]
    fn join_keeps_published_only_measured_only_and_both() {
        let p = published();
        let rows: Vec<&PublishedRow> = p.table("Table 2");
        let ours = [
            measured("Smooth-AP", "R@1", 0.17),
            measured("Smooth-AP (ours, tau=0.1)", "R@1", 0.15),
        ];
        let c = Comparison::build("Smooth-AP Table 2", &rows, &ours).unwrap();
        let status: Vec<Status> = c.rows().iter().map(|r| r.status).collect();
        assert_eq!(
            status,
            [
                Status::PaperOnly,
                Status::Both,
                Status::PaperOnly,
                Status::OursOnly
            ]
        );
        let both = &c.rows()[1];
        assert_eq!((both.paper, both.unit), (Some(79.2), Unit::Percent));
        assert!(
            (both.ours.unwrap() - 17.0).abs() < 1e-12,
            "converted to percent"
        );
        // Ours alone is shown in the unit the paper prints R@1 in (percent here).
        let extra = &c.rows()[3];
        assert_eq!((extra.paper, extra.unit), (None, Unit::Percent));
        assert!((extra.ours.unwrap() - 15.0).abs() < 1e-12);

        let df = c.to_dataframe().unwrap();
        assert_eq!(df.shape(), (4, 15));
        assert_eq!(df.column("ours_n").unwrap().null_count(), 0);
        let paper = df.column("paper").unwrap();
        assert_eq!(paper.null_count(), 1);
        assert_eq!(df.column("ours").unwrap().null_count(), 2);
        assert_eq!(df.column("scale").unwrap().null_count(), 2);

        // Only published / only measured.
        let c = Comparison::build("t", &rows, &[]).unwrap();
        assert!(c.rows().iter().all(|r| r.status == Status::PaperOnly));
        assert!(c.caption().contains("not measured yet"));
        let c = Comparison::build("t", &[], &ours).unwrap();
        assert!(c.rows().iter().all(|r| r.status == Status::OursOnly));
        // With no published value at all, ours keeps its own unit.
        assert_eq!(c.rows()[0].ours, Some(0.17));
        assert_eq!(c.rows()[0].unit, Unit::Fraction);
        // A metric the table does not print takes the table's unit (percent for all of it).
        let c = Comparison::build("t", &rows, &[measured("Smooth-AP", "mAP@R", 0.25)]).unwrap();
        let extra = c.rows().last().unwrap();
        assert_eq!(
            (extra.status, extra.unit),
            (Status::OursOnly, Unit::Percent)
        );
        assert!((extra.ours.unwrap() - 25.0).abs() < 1e-12);
    }

    #[test]
    fn paper_shaped_cells_and_caption() {
        let p = published();
        let rows = p.table("Table 2");
        let c = Comparison::build(
            "Smooth-AP Table 2",
            &rows,
            &[measured("Smooth-AP", "R@10", 0.5)],
        )
        .unwrap();
        let wide = c.paper_shaped(SettingPlacement::Rows).unwrap();
        let md = markdown_table(&wide, "").unwrap();
        assert_eq!(
            md,
            "| method | setting | SOP R@1 | SOP R@10 |\n\
             |---|---|---|---|\n\
             | Margin |  | 72.7 / – |  |\n\
             | Smooth-AP | batch=224 | 79.2 / – | 91.0? / 50.0 |\n"
        );
        let cap = c.caption();
        assert!(cap.contains("Cells: paper / ours (percent)"), "{cap}");
        assert!(
            cap.contains("`quick` scale, embedded shapes: small CNN, 5 epochs"),
            "{cap}"
        );
        let wide = c.paper_shaped(SettingPlacement::Columns).unwrap();
        let names: Vec<&str> = wide.get_column_names().iter().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "method",
                "SOP R@1",
                "SOP R@1 [batch=224]",
                "SOP R@10 [batch=224]"
            ]
        );
    }

    #[test]
    fn bad_measurements_are_errors() {
        let p = published();
        let rows = p.table("Table 2");
        let e = Comparison::build("t", &rows, &[measured("Smooth-AP", "R@1", f64::NAN)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Smooth-AP") && e.contains("NaN"), "{e}");
        let twice = [
            measured("Margin", "R@1", 0.1),
            measured("Margin", "R@1", 0.2),
        ];
        let e = Comparison::build("t", &rows, &twice)
            .unwrap_err()
            .to_string();
        assert!(e.contains("measured twice"), "{e}");
        let mut m = measured("Smooth-AP", "R@1", 1.0);
        m.unit = Unit::Seconds;
        let e = Comparison::build("t", &rows, &[m]).unwrap_err().to_string();
        assert!(e.contains("in s but the paper prints percent"), "{e}");
        let m = measured("Smooth-AP", "R@1", 1.0).with_setting("batch");
        assert!(Comparison::build("t", &rows, &[m]).is_err());
    }

    #[test]
    fn means_over_seeds_carry_their_interval_in_the_papers_unit() {
        let p = published();
        let rows = p.table("Table 2");
        let seeds = Measured::over_seeds(
            "Table 2",
            "Smooth-AP",
            "SOP",
            "R@1",
            vec![0.16, 0.17, 0.18],
            Unit::Fraction,
            quick().with_runs(vec![0, 1, 2], "cpu", "abc"),
        )
        .with_setting("batch=224");
        let c = Comparison::build("T2", &rows, &[seeds]).unwrap();
        let r = &c.rows()[1];
        assert!((r.ours.unwrap() - 17.0).abs() < 1e-12);
        // t_{0.975, 2} · 1 / √3 percent.
        let ci = r.ours_ci95.unwrap();
        assert!(
            (ci - 4.302_652_729_749_462 / 3f64.sqrt()).abs() < 1e-9,
            "{ci}"
        );
        assert_eq!(r.ours_n, 3);
        let df = c.paper_shaped(SettingPlacement::Rows).unwrap();
        let md = markdown_table(&df, &c.caption()).unwrap();
        assert!(md.contains("79.2 / 17.0 ± 2.5"), "{md}");
        assert!(
            md.contains("95% interval") && md.contains("3 seeds (0, 1, 2)"),
            "{md}"
        );
        // A single run has no interval.
        let one = Comparison::build("T2", &rows, &[measured("Smooth-AP", "R@1", 0.17)]).unwrap();
        assert_eq!((one.rows()[1].ours_ci95, one.rows()[1].ours_n), (None, 1));
        assert!(!one.caption().contains("95% interval"));
    }

    #[test]
    fn written_files_hold_long_csv_and_paper_shaped_markdown() {
        let p = published();
        let rows = p.table("Table 2");
        let c = Comparison::build("T2", &rows, &[measured("Smooth-AP", "R@1", 0.17)]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = c
            .write(dir.path(), "smooth_ap_table2", SettingPlacement::Rows)
            .unwrap();
        let csv = std::fs::read_to_string(&files.csv).unwrap();
        assert!(csv.starts_with(
            "table,method,setting,metric,unit,paper,paper_dataset,ours,ours_ci95,ours_n,\
             our_dataset,scale,our_detail,source,status\n"
        ));
        assert!(
            csv.contains(
                "Table 2,Smooth-AP,batch=224,R@1,percent,79.2,SOP,17,,1,embedded shapes,quick,"
            ),
            "{csv}"
        );
        let md = std::fs::read_to_string(&files.md).unwrap();
        assert!(
            md.starts_with("### T2\n") && md.contains("| Smooth-AP | batch=224 | 79.2 / 17.0 |"),
            "{md}"
        );
    }

    #[test]
    fn values_over_seeds_carry_their_seeds_into_the_claims_test() {
        let over = |values: Vec<f64>, seeds: Vec<u64>| {
            Measured::over_seeds(
                "T2",
                "Smooth-AP",
                "SOP",
                "R@1",
                values,
                Unit::Fraction,
                quick().with_runs(seeds, "cpu", "abc"),
            )
        };
        let a = over(vec![0.275, 0.30, 0.23], vec![0, 1, 2]);
        assert_eq!(a.sample().seeds, Some(vec![0, 1, 2]));
        let b = over(vec![0.26, 0.29, 0.21], vec![0, 1, 2]);
        let c = crate::stats::compare(&a.sample(), &b.sample());
        assert_eq!(c.test, crate::stats::Test::PairedSeeds);
        // Seeds that do not match the values one to one: no seeds, no pairing.
        assert_eq!(over(vec![0.3, 0.2], vec![0, 1, 2]).sample().seeds, None);
    }
}

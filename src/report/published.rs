//! The values the five papers print, read from `paper_tables/published/<paper>.csv`.
//!
//! One CSV per paper, long format, one printed number per row:
//!
//! ```text
//! table,method,dataset,metric,setting,value,unit,source
//! Table 2,Smooth-AP,SOP,R@1,batch=384,80.1,percent,Smooth-AP Table 2
//! ```
//!
//! - `table`: the paper's table or figure (`Table 3 left`, `Fig. 4b`); `method`: the row label
//!   as printed (citation kept, e.g. `NSM [59]`); `dataset`: the dataset column (may be empty
//!   where a table has none, e.g. RaMBO's timing table); `metric`: the metric column.
//! - `setting`: the swept or ablated parameter of the row, `key=value` pairs joined by `;`
//!   (`tau=0.01`, `backbone=ResNet-50;batch=96;dim=512`), empty when the row has none.
//! - `value` as printed (`36.32` keeps its two decimals in [`PublishedRow::printed`]); `unit`:
//!   `percent`, `fraction`, `ms` or `s`, exactly as the paper prints it.
//! - `source`: where the number is printed, and any doubt the digests in `shared/design/` raise;
//!   a row whose source says `uncertain` or `GARBLED` is flagged by
//!   [`PublishedRow::is_uncertain`].
//!
//! A dash in the paper (no number) has no row. The files are data, never typed into code: the
//! experiments read them through [`Published`].

use crate::error::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The header every published CSV must have, in this order.
pub const PUBLISHED_COLUMNS: [&str; 8] = [
    "table", "method", "dataset", "metric", "setting", "value", "unit", "source",
];

/// The folder of the published CSVs in this repository (`paper_tables/published`).
pub fn published_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("paper_tables/published")
}

/// The unit a value is printed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 0–100.
    Percent,
    /// 0–1.
    Fraction,
    /// Milliseconds.
    Milliseconds,
    /// Seconds.
    Seconds,
}

impl Unit {
    /// The CSV spelling: `percent`, `fraction`, `ms`, `s`.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Percent => "percent",
            Unit::Fraction => "fraction",
            Unit::Milliseconds => "ms",
            Unit::Seconds => "s",
        }
    }

    /// `value` (in `self`) expressed in `to`: percent ⇄ fraction and ms ⇄ s; `None` between a
    /// score and a time.
    pub fn convert(self, value: f64, to: Unit) -> Option<f64> {
        use Unit::*;
        match (self, to) {
            (a, b) if a == b => Some(value),
            (Fraction, Percent) => Some(value * 100.0),
            (Percent, Fraction) => Some(value / 100.0),
            (Seconds, Milliseconds) => Some(value * 1000.0),
            (Milliseconds, Seconds) => Some(value / 1000.0),
            _ => None,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Unit {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "percent" => Ok(Unit::Percent),
            "fraction" => Ok(Unit::Fraction),
            "ms" => Ok(Unit::Milliseconds),
            "s" => Ok(Unit::Seconds),
            _ => Err(Error::invalid(
                "unit",
                format!("unknown unit {s:?}; expected percent, fraction, ms or s"),
            )),
        }
    }
}

/// One printed number of a paper.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedRow {
    /// The paper's table or figure, e.g. `Table 2`, `Table 5 tau`, `Fig. 4b`.
    pub table: String,
    /// Row label as printed, e.g. `Smooth-AP`, `NSM [59]`.
    pub method: String,
    /// Dataset column, e.g. `SOP`, `VehicleID Small`; may be empty.
    pub dataset: String,
    /// Metric column, e.g. `R@1`, `H-AP`, `1-shot accuracy`.
    pub metric: String,
    /// Swept/ablated parameters, `key=value;…`, or empty.
    pub setting: String,
    /// The value.
    pub value: f64,
    /// The value exactly as written in the CSV (keeps the printed decimals, e.g. `98.0`).
    pub printed: String,
    /// The unit it is printed in.
    pub unit: Unit,
    /// Where it is printed, and any doubt about it.
    pub source: String,
    /// 1-based line of the CSV it was read from.
    pub line: usize,
}

/// The key a printed value and our value of it share: (table, method, dataset, metric,
/// setting).
pub type CellKey = (String, String, String, String, String);

/// The [`CellKey`] of a cell's five fields (a printed value's and ours alike).
pub fn cell_key(table: &str, method: &str, dataset: &str, metric: &str, setting: &str) -> CellKey {
    (
        table.into(),
        method.into(),
        dataset.into(),
        metric.into(),
        setting.into(),
    )
}

impl PublishedRow {
    /// The row's [`CellKey`].
    pub fn key(&self) -> CellKey {
        cell_key(
            &self.table,
            &self.method,
            &self.dataset,
            &self.metric,
            &self.setting,
        )
    }

    /// True when the source marks the value as doubtful (`uncertain` or `GARBLED`, as the
    /// digests do): garbled extraction, inferred labels or columns, values printed with `?`.
    pub fn is_uncertain(&self) -> bool {
        let s = self.source.to_ascii_lowercase();
        s.contains("uncertain") || s.contains("garbled")
    }

    /// Number of decimals printed (`80.1` → 1, `0.850` → 3, `705.0` → 1, `33` → 0), so that our
    /// value can be shown with the paper's precision.
    pub fn decimals(&self) -> usize {
        self.printed
            .split_once('.')
            .map_or(0, |(_, frac)| frac.len())
    }

    /// The value of `key` in [`setting`](Self::setting) (`tau` in `tau=0.01`), if present.
    pub fn setting_value(&self, key: &str) -> Option<&str> {
        setting_value(&self.setting, key)
    }
}

/// The value of `key` in a `key=value;…` setting string.
pub fn setting_value<'a>(setting: &'a str, key: &str) -> Option<&'a str> {
    setting
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Errors unless `setting` is empty or `key=value` pairs joined by `;`, each key non-empty and
/// given once.
pub fn check_setting(setting: &str) -> std::result::Result<(), String> {
    if setting.is_empty() {
        return Ok(());
    }
    let mut keys = Vec::new();
    for pair in setting.split(';') {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "{pair:?} is not key=value (settings are key=value pairs joined by ';')"
            ));
        };
        if k.trim().is_empty() || v.trim().is_empty() {
            return Err(format!("{pair:?} has an empty key or value"));
        }
        if keys.contains(&k) {
            return Err(format!("key {k:?} is given twice"));
        }
        keys.push(k);
    }
    Ok(())
}

/// The published values of one paper (or any file in the format above).
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    path: PathBuf,
    rows: Vec<PublishedRow>,
}

impl Published {
    /// Reads and validates a published CSV.
    ///
    /// Errors name the file, the line and the field: a missing, misplaced or unknown column, a
    /// value that is not a finite number, an unknown unit, an empty `table`/`method`/`metric`, a
    /// malformed `setting`, and a row that repeats the key (table, method, dataset, metric,
    /// setting) of an earlier line.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(path, &text)
    }

    /// The published values of the paper with key `key` in `dir` (`dir/<key>.csv`, e.g.
    /// `smooth_ap`, the key of its experiment).
    pub fn for_key(dir: impl AsRef<Path>, key: &str) -> Result<Self> {
        Self::load(dir.as_ref().join(format!("{key}.csv")))
    }

    /// Parses CSV text; `path` only names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            // Rows with a wrong number of fields reach `parse_row`, which names the line.
            .flexible(true)
            .from_reader(text.as_bytes());
        let header = reader
            .headers()
            .map_err(|e| Error::line(path, 1, format!("cannot read the header: {e}")))?
            .clone();
        check_header(path, &header)?;
        let mut rows: Vec<PublishedRow> = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for record in reader.records() {
            let record = record.map_err(|e| {
                let line = e.position().map_or(0, |p| p.line() as usize);
                Error::line(path, line, format!("malformed CSV: {e}"))
            })?;
            let line = record.position().map_or(0, |p| p.line() as usize);
            let row = parse_row(path, line, &record)?;
            if let Some(first) = seen.insert(row.key(), line) {
                return Err(Error::line(
                    path,
                    line,
                    format!(
                        "repeats line {first}: the same table {:?}, method {:?}, dataset {:?}, \
                         metric {:?} and setting {:?}",
                        row.table, row.method, row.dataset, row.metric, row.setting
                    ),
                ));
            }
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(Error::file(path, "holds a header but no value"));
        }
        Ok(Published {
            path: path.to_path_buf(),
            rows,
        })
    }

    /// The file the values were read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every row, in file order.
    pub fn rows(&self) -> &[PublishedRow] {
        &self.rows
    }

    /// The distinct `table` names, in file order.
    pub fn tables(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !out.contains(&r.table.as_str()) {
                out.push(&r.table);
            }
        }
        out
    }

    /// The rows of one table, in file order (empty if there is no such table).
    pub fn table(&self, table: &str) -> Vec<&PublishedRow> {
        self.rows.iter().filter(|r| r.table == table).collect()
    }

    /// The row with this exact key, if any.
    pub fn get(
        &self,
        table: &str,
        method: &str,
        dataset: &str,
        metric: &str,
        setting: &str,
    ) -> Option<&PublishedRow> {
        self.rows.iter().find(|r| {
            r.table == table
                && r.method == method
                && r.dataset == dataset
                && r.metric == metric
                && r.setting == setting
        })
    }
}

fn check_header(path: &Path, header: &csv::StringRecord) -> Result<()> {
    let got: Vec<&str> = header.iter().map(str::trim).collect();
    for (i, want) in PUBLISHED_COLUMNS.iter().enumerate() {
        match got.iter().position(|g| g == want) {
            None => {
                return Err(Error::line(
                    path,
                    1,
                    format!(
                        "missing column {want:?}; the header must be {}",
                        PUBLISHED_COLUMNS.join(",")
                    ),
                ))
            }
            Some(j) if j != i => {
                return Err(Error::line(
                    path,
                    1,
                    format!(
                        "column {want:?} is column {} but must be column {}; the header must be {}",
                        j + 1,
                        i + 1,
                        PUBLISHED_COLUMNS.join(",")
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    if got.len() > PUBLISHED_COLUMNS.len() {
        return Err(Error::line(
            path,
            1,
            format!(
                "unknown column {:?}; the header must be {}",
                got[PUBLISHED_COLUMNS.len()],
                PUBLISHED_COLUMNS.join(",")
            ),
        ));
    }
    Ok(())
}

fn parse_row(path: &Path, line: usize, record: &csv::StringRecord) -> Result<PublishedRow> {
    if record.len() != PUBLISHED_COLUMNS.len() {
        return Err(Error::line(
            path,
            line,
            format!(
                "{} fields, expected {} ({})",
                record.len(),
                PUBLISHED_COLUMNS.len(),
                PUBLISHED_COLUMNS.join(",")
            ),
        ));
    }
    let field = |i: usize| record.get(i).unwrap_or("").trim().to_string();
    let bad = |name: &str, msg: String| Error::line(path, line, format!("field {name:?}: {msg}"));
    for (i, name) in [(0, "table"), (1, "method"), (3, "metric")] {
        if field(i).is_empty() {
            return Err(bad(name, "is empty".into()));
        }
    }
    let printed = field(5);
    let value: f64 = printed
        .parse()
        .map_err(|_| bad("value", format!("{printed:?} is not a number")))?;
    if !value.is_finite() {
        return Err(bad("value", format!("{printed:?} is not a finite number")));
    }
    let unit: Unit = field(6)
        .parse()
        .map_err(|e: Error| bad("unit", e.to_string()))?;
    let setting = field(4);
    check_setting(&setting).map_err(|msg| bad("setting", msg))?;
    Ok(PublishedRow {
        table: field(0),
        method: field(1),
        dataset: field(2),
        metric: field(3),
        setting,
        value,
        printed,
        unit,
        source: field(7),
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "table,method,dataset,metric,setting,value,unit,source\n";

    fn parse(body: &str) -> Result<Published> {
        Published::parse(Path::new("p.csv"), &format!("{HEADER}{body}"))
    }

    #[test]
    fn reads_rows_with_their_lines_and_printed_text() {
        let p = parse(
            "Table 2,Smooth-AP,SOP,R@1,batch=384,80.1,percent,Smooth-AP Table 2\n\
             Table 4,+ Smooth-AP,IJB-C,mAP,,0.850,fraction,\"Table 4, uncertain\"\n",
        )
        .unwrap();
        let r = &p.rows()[1];
        assert_eq!((r.line, r.value, r.printed.as_str()), (3, 0.85, "0.850"));
        assert_eq!((r.unit, r.decimals()), (Unit::Fraction, 3));
        assert!(r.is_uncertain() && !p.rows()[0].is_uncertain());
        assert_eq!(p.rows()[0].setting_value("batch"), Some("384"));
        assert_eq!(p.tables(), ["Table 2", "Table 4"]);
        assert!(p
            .get("Table 2", "Smooth-AP", "SOP", "R@1", "batch=384")
            .is_some());
        assert!(p.get("Table 2", "Smooth-AP", "SOP", "R@1", "").is_none());
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let e = parse("T,M,D,R@1,,8o.1,percent,s\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.csv:2:") && e.contains("\"value\"") && e.contains("8o.1"),
            "{e}"
        );
        let e = parse("T,M,D,R@1,,1,percent,s\nT,M,D,R@1,,NaN,percent,s\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.csv:3:") && e.contains("finite"), "{e}");
        let e = parse("T,M,D,R@1,,1,percents,s\n").unwrap_err().to_string();
        assert!(e.contains("\"unit\"") && e.contains("percents"), "{e}");
        let e = parse("T,,D,R@1,,1,percent,s\n").unwrap_err().to_string();
        assert!(e.contains("field \"method\": is empty"), "{e}");
        let e = parse("T,M,D,R@1,tau,1,percent,s\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"setting\"") && e.contains("key=value"), "{e}");
        let e = parse("T,M,D,R@1,,1,percent\n").unwrap_err().to_string();
        assert!(e.starts_with("p.csv:2:"), "{e}");
        let e = parse("T,M,D,R@1,,1,percent,s\nT,M,D,R@1,,2,percent,s\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.csv:3:") && e.contains("repeats line 2"),
            "{e}"
        );
        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("no value"), "{e}");
    }

    #[test]
    fn header_errors_name_the_column() {
        let bad = |h: &str| {
            Published::parse(Path::new("p.csv"), &format!("{h}\nT,M,D,R,,1,percent,s\n"))
                .unwrap_err()
                .to_string()
        };
        let e = bad("table,method,dataset,metric,setting,value,source");
        assert!(
            e.starts_with("p.csv:1:") && e.contains("missing column \"unit\""),
            "{e}"
        );
        let e = bad("method,table,dataset,metric,setting,value,unit,source");
        assert!(e.contains("\"table\" is column 2"), "{e}");
        let e = bad("table,method,dataset,metric,setting,value,unit,source,extra");
        assert!(e.contains("unknown column \"extra\""), "{e}");
    }

    #[test]
    fn units_convert_between_compatible_scales_only() {
        assert_eq!(Unit::Fraction.convert(0.5, Unit::Percent), Some(50.0));
        assert_eq!(Unit::Percent.convert(50.0, Unit::Fraction), Some(0.5));
        assert_eq!(Unit::Seconds.convert(0.5, Unit::Milliseconds), Some(500.0));
        assert_eq!(Unit::Percent.convert(1.0, Unit::Seconds), None);
        for u in [
            Unit::Percent,
            Unit::Fraction,
            Unit::Milliseconds,
            Unit::Seconds,
        ] {
            assert_eq!(u.as_str().parse::<Unit>().unwrap(), u);
        }
    }

    #[test]
    fn settings_are_key_value_pairs() {
        assert!(check_setting("").is_ok());
        assert!(check_setting("backbone=ResNet-50;batch=96").is_ok());
        assert!(check_setting("a=1;a=2").unwrap_err().contains("twice"));
        assert!(check_setting("a=").is_err());
        assert_eq!(setting_value("a=1;b=x y", "b"), Some("x y"));
        assert_eq!(setting_value("a=1", "c"), None);
    }
}

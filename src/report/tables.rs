//! Writing a polars `DataFrame` as CSV and as a Markdown table, both atomically.
//!
//! polars' own CSV writer is behind a feature that costs build minutes; tables here are small
//! (a paper table is at most a few hundred cells), so they are written cell by cell.

use crate::error::{Error, Result};
use crate::io::write_atomically;
use polars::prelude::{AnyValue, DataFrame};
use std::path::{Path, PathBuf};

/// The two files of a written table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFiles {
    /// `dir/stem.csv`.
    pub csv: PathBuf,
    /// `dir/stem.md`.
    pub md: PathBuf,
}

/// The text of one cell: strings as they are, floats in Rust's shortest round-trip form,
/// `None` for a null.
pub fn cell_text(value: &AnyValue) -> Option<String> {
    match value {
        AnyValue::Null => None,
        AnyValue::String(s) => Some(s.to_string()),
        AnyValue::StringOwned(s) => Some(s.to_string()),
        AnyValue::Float64(v) => Some(format!("{v}")),
        AnyValue::Float32(v) => Some(format!("{v}")),
        AnyValue::Boolean(b) => Some(b.to_string()),
        AnyValue::Int8(v) => Some(v.to_string()),
        AnyValue::Int16(v) => Some(v.to_string()),
        AnyValue::Int32(v) => Some(v.to_string()),
        AnyValue::Int64(v) => Some(v.to_string()),
        AnyValue::UInt8(v) => Some(v.to_string()),
        AnyValue::UInt16(v) => Some(v.to_string()),
        AnyValue::UInt32(v) => Some(v.to_string()),
        AnyValue::UInt64(v) => Some(v.to_string()),
        other => Some(other.to_string()),
    }
}

/// The cells of `df` as text, row-major (`None` = null).
fn cells(df: &DataFrame) -> Result<Vec<Vec<Option<String>>>> {
    let columns = df.columns();
    (0..df.height())
        .map(|i| {
            columns
                .iter()
                .map(|c| {
                    c.get(i).map(|v| cell_text(&v)).map_err(|e| {
                        Error::invalid("table", format!("cannot read column {}: {e}", c.name()))
                    })
                })
                .collect()
        })
        .collect()
}

/// `df` as a Markdown table (a header row, a `---` row, one row per record; nulls as `–`,
/// `|` escaped), preceded by `caption` and a blank line when the caption is not empty.
pub fn markdown_table(df: &DataFrame, caption: &str) -> Result<String> {
    let escape = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::new();
    if !caption.is_empty() {
        out.push_str(caption.trim_end());
        out.push_str("\n\n");
    }
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|n| escape(n.as_str()))
        .collect();
    out.push_str(&format!("| {} |\n", names.join(" | ")));
    out.push_str(&format!("|{}\n", "---|".repeat(names.len())));
    for row in cells(df)? {
        let row: Vec<String> = row
            .iter()
            .map(|c| c.as_deref().map_or_else(|| "–".to_string(), escape))
            .collect();
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    Ok(out)
}

/// `df` as CSV text with a header; nulls are empty fields.
pub fn csv_text(df: &DataFrame) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let err = |e: csv::Error| Error::invalid("table", format!("cannot write CSV: {e}"));
    w.write_record(df.get_column_names().iter().map(|n| n.as_str()))
        .map_err(err)?;
    for row in cells(df)? {
        w.write_record(row.iter().map(|c| c.as_deref().unwrap_or("")))
            .map_err(err)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| Error::invalid("table", format!("cannot write CSV: {e}")))?;
    String::from_utf8(bytes).map_err(|e| Error::invalid("table", format!("not UTF-8: {e}")))
}

/// Writes `df` to `dir/stem.csv` and, under `caption` (e.g. the scale and provenance of our
/// values), to `dir/stem.md`; both atomically, creating `dir` if needed.
pub fn write_table(df: &DataFrame, dir: &Path, stem: &str, caption: &str) -> Result<TableFiles> {
    let csv = csv_text(df)?;
    let md = markdown_table(df, caption)?;
    write_text_pair(dir, stem, &csv, &md)
}

/// Writes `csv` to `dir/stem.csv` and `md` to `dir/stem.md`, atomically.
pub(crate) fn write_text_pair(dir: &Path, stem: &str, csv: &str, md: &str) -> Result<TableFiles> {
    if stem.is_empty() || stem.contains(['/', '\\']) {
        return Err(Error::invalid(
            "stem",
            format!("{stem:?} must be a plain file name without extension"),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let files = TableFiles {
        csv: dir.join(format!("{stem}.csv")),
        md: dir.join(format!("{stem}.md")),
    };
    write_atomically(&files.csv, |w| w.write_all(csv.as_bytes()))?;
    write_atomically(&files.md, |w| w.write_all(md.as_bytes()))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use polars::prelude::Column;

    fn tiny() -> DataFrame {
        DataFrame::new(
            2,
            vec![
                Column::new("method".into(), ["Smooth-AP", "a|b"]),
                Column::new("paper".into(), [Some(80.1), None]),
                Column::new("ours".into(), [Some(0.25), Some(17.0)]),
            ],
        )
        .unwrap()
    }

    #[test]
    fn markdown_of_a_tiny_table() {
        let md = markdown_table(&tiny(), "Scale: `quick`.").unwrap();
        assert_eq!(
            md,
            "Scale: `quick`.\n\n\
             | method | paper | ours |\n\
             |---|---|---|\n\
             | Smooth-AP | 80.1 | 0.25 |\n\
             | a\\|b | – | 17 |\n"
        );
        assert!(markdown_table(&tiny(), "").unwrap().starts_with("| method"));
    }

    #[test]
    fn csv_has_empty_fields_for_nulls_and_files_are_written() {
        assert_eq!(
            csv_text(&tiny()).unwrap(),
            "method,paper,ours\nSmooth-AP,80.1,0.25\na|b,,17\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("new");
        let files = write_table(&tiny(), &sub, "t", "cap").unwrap();
        assert_eq!(files.csv, sub.join("t.csv"));
        assert!(std::fs::read_to_string(&files.md)
            .unwrap()
            .starts_with("cap\n\n| method"));
        assert!(write_table(&tiny(), &sub, "a/b", "").is_err());
    }
}

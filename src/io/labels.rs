//! Hierarchical labels from CSV (a header line, then one integer column per level, finest first)
//! and parquet (integer columns, one per level) files, and CSV output.
//!
//! Both readers take an optional list of column names, in the order finest → coarsest; without
//! it, every column is a level, in file order. Columns that are not selected may hold anything
//! (image paths, split names, …).

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::io::atomic::write_atomically;
use crate::io::embeddings::extension;
use polars::prelude::{DataType, ParquetReader, SerReader};
use std::path::Path;

/// Labels with the names of their levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelTable {
    /// `N × L` class ids, finest level first.
    pub labels: Labels,
    /// The column name of each level, finest first.
    pub level_names: Vec<String>,
}

/// Reads labels, choosing the format from the extension: `.csv` ([`read_labels_csv`]) or
/// `.parquet` ([`read_labels_parquet`]).
pub fn read_labels(path: &Path, columns: Option<&[String]>) -> Result<LabelTable> {
    match extension(path).as_deref() {
        Some("csv") => read_labels_csv(path, columns),
        Some("parquet") => read_labels_parquet(path, columns),
        _ => Err(Error::file(
            path,
            "unknown label format: expected a .csv or .parquet file",
        )),
    }
}

/// Reads a comma-separated label file: a header line naming the columns, then one line per
/// item. Fields are trimmed; empty lines are skipped.
///
/// Errors name the file and, for a bad line, its 1-based line number, for: an empty file, a first
/// line that looks like data rather than a header, a selected column missing from the header, a
/// line whose field count differs from the header's, and an empty or non-integer field in a
/// selected column (naming the column). Labels that do not form a hierarchy are rejected as by
/// [`Labels::new`].
pub fn read_labels_csv(path: &Path, columns: Option<&[String]>) -> Result<LabelTable> {
    // The whole file is kept: line numbers are computed from byte offsets (see `line_at`).
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes.as_slice());
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| csv_error(path, &bytes, e))?
        .iter()
        .map(str::to_string)
        .collect();
    if header.is_empty() || header.iter().all(|h| h.is_empty()) {
        return Err(Error::file(
            path,
            "empty file: expected a header line naming the label columns, e.g. \
             `class_id,super_class_id`",
        ));
    }
    if header.iter().all(|h| h.parse::<ClassId>().is_ok()) {
        return Err(Error::line(
            path,
            line_at(&bytes, 0),
            format!(
                "'{}' looks like data, but the first line must be a header naming the label \
                 columns, e.g. `class_id,super_class_id`",
                header.join(",")
            ),
        ));
    }
    let (selected, level_names) = select_columns(&header, columns, path)?;
    let explicit = columns.is_some_and(|c| !c.is_empty());
    let mut data = Vec::new();
    let mut n = 0usize;
    for record in reader.records() {
        let record = record.map_err(|e| csv_error(path, &bytes, e))?;
        let line = record
            .position()
            .map_or(n + 2, |p| line_at(&bytes, p.byte() as usize));
        if record.len() != header.len() {
            return Err(Error::line(
                path,
                line,
                format!(
                    "{} field(s), but the header has {} ({}); is the separator a comma?",
                    record.len(),
                    header.len(),
                    header.join(",")
                ),
            ));
        }
        for &c in &selected {
            let id = parse_class_id(&record[c], &header[c]).map_err(|m| {
                let hint = if explicit {
                    ""
                } else {
                    " (every column is a label level unless the label columns are chosen by name, \
                     `--label-columns` on the command line)"
                };
                Error::line(path, line, format!("{m}{hint}"))
            })?;
            data.push(id);
        }
        n += 1;
    }
    if n == 0 {
        return Err(Error::file(path, "no label lines after the header"));
    }
    let labels = Labels::from_flat(n, selected.len(), data).map_err(|e| in_file(path, e))?;
    Ok(LabelTable {
        labels,
        level_names,
    })
}

/// Reads labels from a parquet file: one integer column per level (any integer width, signed or
/// not, no missing values).
///
/// Errors name the file for: an unreadable file, a selected column that does not exist (listing
/// those that do), a non-integer column, a missing value (naming the column and 0-based row) and
/// an unsigned value beyond the i64 range.
pub fn read_labels_parquet(path: &Path, columns: Option<&[String]>) -> Result<LabelTable> {
    let polars_error = |e: polars::error::PolarsError| Error::file(path, format!("parquet: {e}"));
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = ParquetReader::new(file);
    let header: Vec<String> = reader
        .schema()
        .map_err(polars_error)?
        .iter_names()
        .map(|s| s.to_string())
        .collect();
    let (_, level_names) = select_columns(&header, columns, path)?;
    let frame = reader
        .with_columns(Some(level_names.clone()))
        .finish()
        .map_err(polars_error)?;
    let n = frame.height();
    if n == 0 {
        return Err(Error::file(path, "no rows"));
    }
    let mut data = vec![0 as ClassId; n * level_names.len()];
    for (l, name) in level_names.iter().enumerate() {
        let column = frame.column(name).map_err(polars_error)?;
        if !column.dtype().is_integer() {
            return Err(Error::file(
                path,
                format!(
                    "column '{name}' has type {}; label columns must hold integer class ids",
                    column.dtype()
                ),
            ));
        }
        let ids = column.strict_cast(&DataType::Int64).map_err(|_| {
            Error::file(
                path,
                format!("column '{name}' holds class ids beyond the 64-bit signed integer range"),
            )
        })?;
        let ids = ids.i64().map_err(polars_error)?;
        if let Some(row) = ids.first_null() {
            return Err(Error::file(
                path,
                format!("column '{name}' has a missing value in row {row} (0-based)"),
            ));
        }
        for (i, id) in ids.into_no_null_iter().enumerate() {
            data[i * level_names.len() + l] = id;
        }
    }
    let labels = Labels::from_flat(n, level_names.len(), data).map_err(|e| in_file(path, e))?;
    Ok(LabelTable {
        labels,
        level_names,
    })
}

/// Writes labels as CSV (header `names`, one line per item), atomically.
pub fn write_labels_csv(path: &Path, labels: &Labels, names: &[String]) -> Result<()> {
    if names.len() != labels.num_levels() {
        return Err(Error::invalid(
            "level names",
            format!(
                "{} names for {} label levels",
                names.len(),
                labels.num_levels()
            ),
        ));
    }
    write_atomically(path, |w| {
        writeln!(w, "{}", names.join(","))?;
        for i in 0..labels.len() {
            let row: Vec<String> = labels.row(i).iter().map(|c| c.to_string()).collect();
            writeln!(w, "{}", row.join(","))?;
        }
        Ok(())
    })
}

/// Indices and names of the label columns: `columns` looked up in `header`, or every column.
fn select_columns(
    header: &[String],
    columns: Option<&[String]>,
    path: &Path,
) -> Result<(Vec<usize>, Vec<String>)> {
    let names: Vec<String> = match columns {
        Some(c) if !c.is_empty() => c.to_vec(),
        _ => header.to_vec(),
    };
    let mut indices = Vec::with_capacity(names.len());
    for name in &names {
        let mut hits = header.iter().enumerate().filter(|(_, h)| *h == name);
        match (hits.next(), hits.next()) {
            (Some((i, _)), None) => indices.push(i),
            (None, _) => {
                return Err(Error::file(
                    path,
                    format!(
                        "no column named '{name}'; the columns are: {}",
                        header.join(", ")
                    ),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(Error::file(
                    path,
                    format!("the column name '{name}' appears more than once"),
                ))
            }
        }
    }
    Ok((indices, names))
}

/// Parses one class id; the message names the column.
fn parse_class_id(field: &str, column: &str) -> std::result::Result<ClassId, String> {
    if field.is_empty() {
        return Err(format!(
            "column '{column}' is empty; every item needs a class id"
        ));
    }
    field
        .parse::<ClassId>()
        .map_err(|_| format!("column '{column}': '{field}' is not an integer class id"))
}

/// A csv-crate error with the file and, when known, the line.
fn csv_error(path: &Path, bytes: &[u8], e: csv::Error) -> Error {
    let line = e.position().map(|p| line_at(bytes, p.byte() as usize));
    match (e.into_kind(), line) {
        (csv::ErrorKind::Io(io), _) => Error::io(path, io),
        (kind, Some(line)) => Error::line(path, line, csv_kind_message(kind)),
        (kind, None) => Error::file(path, csv_kind_message(kind)),
    }
}

/// The 1-based line of the record that the csv crate places at byte `offset`.
///
/// The crate's own line count is off after blank lines and in CRLF files (a record "starts" right
/// after the previous terminator, and `\r\n` counts its `\n` on the next record), so the line
/// is recomputed: skip the line breaks the reader skipped, then count the `\n` before the record.
fn line_at(bytes: &[u8], offset: usize) -> usize {
    let start = offset.min(bytes.len());
    let skipped = bytes[start..]
        .iter()
        .take_while(|&&b| b == b'\n' || b == b'\r')
        .count();
    1 + bytes[..start + skipped]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

fn csv_kind_message(kind: csv::ErrorKind) -> String {
    match kind {
        csv::ErrorKind::Utf8 { err, .. } => format!("not valid UTF-8 text ({err})"),
        other => format!("{other:?}"),
    }
}

/// Adds the file name to a label-validation error.
fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::Labels(msg) => Error::file(
            path,
            format!("invalid labels: {msg} (rows are items, counted from 0 after the header)"),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polars::prelude::{df, ParquetWriter};

    fn csv(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
        let p = dir.path().join("labels.csv");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn err(p: &Path, columns: Option<&[String]>) -> String {
        read_labels(p, columns).unwrap_err().to_string()
    }

    #[test]
    fn reads_csv_with_all_or_selected_columns() {
        let dir = tempfile::tempdir().unwrap();
        let p = csv(
            &dir,
            "\u{feff}path,class_id,super_class_id\r\na.jpg,3,1\n b.jpg , 3 , 1 \n\nc.jpg,4,1\nd.jpg,9,2\n",
        );
        let cols = vec!["class_id".to_string(), "super_class_id".to_string()];
        let t = read_labels(&p, Some(&cols)).unwrap();
        assert_eq!(t.level_names, cols);
        assert_eq!(t.labels.len(), 4);
        assert_eq!(t.labels.as_flat(), &[3, 1, 3, 1, 4, 1, 9, 2]);
        let one = read_labels(&p, Some(&["super_class_id".to_string()])).unwrap();
        assert_eq!(one.labels.column(0), vec![1, 1, 1, 2]);
        // Without a selection the path column is a level, and is not an integer.
        let e = err(&p, None);
        assert!(
            e.contains("labels.csv:2:") && e.contains("column 'path'"),
            "{e}"
        );
    }

    #[test]
    fn csv_errors_name_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = csv(&dir, "fine,coarse\n1,0\n2;0\n");
        let e = err(&p, None);
        assert!(
            e.contains("labels.csv:3:") && e.contains("1 field(s)"),
            "{e}"
        );
        // CRLF line ends and blank lines do not shift the line numbers.
        let p = csv(&dir, "fine,coarse\r\n1,0\r\n\r\n\n2;0\r\n");
        let e = err(&p, None);
        assert!(e.contains("labels.csv:5:"), "{e}");
        let p = csv(&dir, "fine,coarse\n1,0\n2,0,5\n");
        assert!(
            err(&p, None).contains("labels.csv:3: 3 field(s)"),
            "{}",
            err(&p, None)
        );
        let p = csv(&dir, "fine,coarse\n1,0\n2,0\n2.5,0\n");
        let e = err(&p, None);
        assert!(
            e.contains("labels.csv:4:") && e.contains("column 'fine': '2.5' is not an integer"),
            "{e}"
        );
        let p = csv(&dir, "fine,coarse\n1,\n");
        assert!(
            err(&p, None).contains("column 'coarse' is empty"),
            "{}",
            err(&p, None)
        );
        let p = csv(&dir, "1,0\n2,0\n");
        assert!(err(&p, None).contains("labels.csv:1:") && err(&p, None).contains("header"));
        let p = csv(&dir, "");
        assert!(err(&p, None).contains("empty file"), "{}", err(&p, None));
        let p = csv(&dir, "fine,coarse\n");
        assert!(
            err(&p, None).contains("no label lines"),
            "{}",
            err(&p, None)
        );
        let p = csv(&dir, "fine,coarse\n1,0\n");
        let e = err(&p, Some(&["class".to_string()]));
        assert!(
            e.contains("no column named 'class'") && e.contains("fine, coarse"),
            "{e}"
        );
        // A fine class under two coarse classes is not a hierarchy.
        let p = csv(&dir, "fine,coarse\n1,0\n1,5\n");
        let e = err(&p, None);
        assert!(
            e.contains("labels.csv") && e.contains("class 1 at level 0"),
            "{e}"
        );
        let p = dir.path().join("labels.txt");
        assert!(err(&p, None).contains(".csv or .parquet"));
    }

    #[test]
    fn csv_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let y = Labels::new(vec![vec![10, 1], vec![11, 1], vec![-3, 2]]).unwrap();
        let names = vec!["class_id".to_string(), "super_class_id".to_string()];
        let p = dir.path().join("out.csv");
        write_labels_csv(&p, &y, &names).unwrap();
        let t = read_labels_csv(&p, None).unwrap();
        assert_eq!(t.labels, y);
        assert_eq!(t.level_names, names);
        assert!(write_labels_csv(&p, &y, &names[..1]).is_err());
    }

    fn parquet(
        dir: &tempfile::TempDir,
        frame: &mut polars::prelude::DataFrame,
    ) -> std::path::PathBuf {
        let p = dir.path().join("labels.parquet");
        ParquetWriter::new(std::fs::File::create(&p).unwrap())
            .finish(frame)
            .unwrap();
        p
    }

    #[test]
    fn reads_parquet_integer_columns() {
        let dir = tempfile::tempdir().unwrap();
        let mut frame = df!(
            "path" => ["a", "b", "c"],
            "super" => [1u32, 1, 2],
            "class" => [7i32, 8, 9],
        )
        .unwrap();
        let p = parquet(&dir, &mut frame);
        let cols = vec!["class".to_string(), "super".to_string()];
        let t = read_labels(&p, Some(&cols)).unwrap();
        assert_eq!(t.level_names, cols);
        assert_eq!(t.labels.as_flat(), &[7, 1, 8, 1, 9, 2]);
        let e = err(&p, None);
        assert!(
            e.contains("labels.parquet") && e.contains("column 'path'"),
            "{e}"
        );
        let e = err(&p, Some(&["klass".to_string()]));
        assert!(
            e.contains("no column named 'klass'") && e.contains("path, super, class"),
            "{e}"
        );
    }

    #[test]
    fn parquet_rejects_floats_and_missing_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut frame = df!("class" => [1.0f64, 2.0]).unwrap();
        let p = parquet(&dir, &mut frame);
        assert!(
            err(&p, None).contains("integer class ids"),
            "{}",
            err(&p, None)
        );
        let mut frame = df!("class" => [Some(1i64), None, Some(3)]).unwrap();
        let p = parquet(&dir, &mut frame);
        let e = err(&p, None);
        assert!(e.contains("missing value in row 1"), "{e}");
        let mut frame = df!("class" => [u64::MAX]).unwrap();
        let p = parquet(&dir, &mut frame);
        assert!(
            err(&p, None).contains("beyond the 64-bit"),
            "{}",
            err(&p, None)
        );
    }
}

//! Evaluation results as JSON or CSV, written atomically.
//!
//! Values are written with Rust's shortest round-trip formatting, so reading a file back gives
//! the very `f64` that was computed: results can be compared to the last digit.

use super::atomic::write_atomically;
use crate::error::{Error, Result};
use crate::io::embeddings::extension;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// One metric value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// Metric name: "mAP", "mAP@R", "R-precision", "R@1", "P@1", "H-AP", "ASI", "NDCG", …
    pub metric: String,
    /// Label level (column, 0 = finest) that defines the positives of a binary metric; `None` for
    /// the hierarchical metrics, which use every level.
    pub level: Option<usize>,
    /// The name of that level (its column name in the label file).
    pub level_name: Option<String>,
    /// The metric averaged over the counted queries; NaN when no query was counted (written as
    /// `null` in JSON and an empty field in CSV).
    #[serde(with = "crate::io::json_f64")]
    pub value: f64,
    /// Number of queries averaged.
    pub queries: usize,
    /// Queries skipped because they have no positive among the references.
    pub skipped: usize,
    /// The same metric of a second model on the same queries, compared query by query
    /// (`rankwise eval --versus`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versus: Option<Versus>,
}

/// A row's metric against a second model's on the same queries
/// ([`crate::retrieval::paired_differences`]: the paired t-test over the queries).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versus {
    /// The second model's value.
    #[serde(with = "crate::io::json_f64")]
    pub value: f64,
    /// The mean over the queries of this row's value minus the second model's.
    #[serde(with = "crate::io::json_f64")]
    pub difference: f64,
    /// The 95% interval of `difference`, lower end (null with fewer than two queries).
    #[serde(with = "crate::io::json_f64")]
    pub interval_low: f64,
    /// Its upper end.
    #[serde(with = "crate::io::json_f64")]
    pub interval_high: f64,
    /// The two-sided p-value of the paired t-test.
    pub p: f64,
    /// The queries compared.
    pub queries: usize,
}

impl From<&crate::retrieval::PairedDifference> for Versus {
    fn from(d: &crate::retrieval::PairedDifference) -> Self {
        Versus {
            value: d.b,
            difference: d.difference,
            interval_low: d.interval.0,
            interval_high: d.interval.1,
            p: d.p,
            queries: d.queries,
        }
    }
}

/// A whole evaluation: the metric rows and the settings that produced them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultTable {
    /// Number of queries evaluated.
    pub num_queries: usize,
    /// Number of references each query was ranked against (itself excluded).
    pub num_references: usize,
    /// Inputs and options (file names, relevance, …), for the record.
    pub settings: BTreeMap<String, String>,
    /// One row per metric (and level).
    pub rows: Vec<ResultRow>,
}

/// Output format of a results file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFormat {
    /// The whole [`ResultTable`] as pretty-printed JSON.
    Json,
    /// The rows only, with a header: `metric,level,level_name,value,queries,skipped` (and, with a
    /// comparison, `versus_value,difference,interval_low,interval_high,p,versus_queries`).
    Csv,
}

impl ResultFormat {
    /// The format named by the extension of `path` (`.json` or `.csv`).
    pub fn from_path(path: &Path) -> Result<Self> {
        match extension(path).as_deref() {
            Some("json") => Ok(ResultFormat::Json),
            Some("csv") => Ok(ResultFormat::Csv),
            _ => Err(Error::invalid(
                "output",
                format!(
                    "{}: unknown results format; use a .json or .csv file name",
                    path.display()
                ),
            )),
        }
    }
}

/// Writes `table` to `path` in the format of its extension, atomically.
///
/// A metric no query was counted for (all lone) has no value: NaN, written as JSON `null` or an
/// empty CSV field, next to its `queries = 0`. Any other non-finite value is an error naming the
/// metric, never written silently.
pub fn write_results(path: &Path, table: &ResultTable) -> Result<()> {
    let format = ResultFormat::from_path(path)?;
    let undefined = |r: &ResultRow| r.value.is_nan() && r.queries == 0;
    if let Some(row) = table
        .rows
        .iter()
        .find(|r| !r.value.is_finite() && !undefined(r))
    {
        return Err(Error::invalid(
            "results",
            format!(
                "{} (level {}) is {}; refusing to write {}",
                row.metric,
                row.level_name.as_deref().unwrap_or("all"),
                row.value,
                path.display()
            ),
        ));
    }
    match format {
        ResultFormat::Json => write_json(path, table),
        ResultFormat::Csv => write_atomically(path, |w| write_csv_rows(w, &table.rows)),
    }
}

/// `value` as pretty-printed JSON (a results table), written atomically.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::file(path, format!("cannot encode results: {e}")))?;
    write_atomically(path, |w| writeln!(w, "{text}"))
}

/// The shortest string that parses back to the same value (`{}`, or `{:e}` for magnitudes
/// whose positional form would run to dozens of zeros, as tiny p-values do); NaN is empty.
pub(crate) fn csv_f64(v: f64) -> String {
    if v.is_nan() {
        String::new()
    } else if v != 0.0 && !(1e-5..1e16).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

fn write_csv_rows(w: &mut dyn Write, rows: &[ResultRow]) -> std::io::Result<()> {
    let mut out = csv::Writer::from_writer(w);
    let versus = rows.iter().any(|r| r.versus.is_some());
    let mut header = vec![
        "metric",
        "level",
        "level_name",
        "value",
        "queries",
        "skipped",
    ];
    if versus {
        header.extend([
            "versus_value",
            "difference",
            "interval_low",
            "interval_high",
            "p",
            "versus_queries",
        ]);
    }
    out.write_record(&header)?;
    for r in rows {
        let mut record = vec![
            r.metric.clone(),
            r.level.map(|l| l.to_string()).unwrap_or_default(),
            r.level_name.clone().unwrap_or_default(),
            csv_f64(r.value),
            r.queries.to_string(),
            r.skipped.to_string(),
        ];
        if versus {
            match &r.versus {
                Some(v) => record.extend([
                    csv_f64(v.value),
                    csv_f64(v.difference),
                    csv_f64(v.interval_low),
                    csv_f64(v.interval_high),
                    csv_f64(v.p),
                    v.queries.to_string(),
                ]),
                None => record.extend(std::iter::repeat_n(String::new(), 6)),
            }
        }
        out.write_record(&record)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ResultTable {
        ResultTable {
            num_queries: 3,
            num_references: 2,
            settings: BTreeMap::from([("relevance".to_string(), "pop".to_string())]),
            rows: vec![
                ResultRow {
                    metric: "R@1".into(),
                    level: Some(0),
                    level_name: Some("class_id".into()),
                    // serde_json's default float parser reads this one 1 ulp off.
                    value: 586.0 / 600.0,
                    queries: 3,
                    skipped: 0,
                    versus: None,
                },
                ResultRow {
                    metric: "H-AP".into(),
                    level: None,
                    level_name: None,
                    value: 0.1 + 0.2,
                    queries: 2,
                    skipped: 1,
                    versus: None,
                },
            ],
        }
    }

    #[test]
    fn json_round_trips_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write_results(&p, &table()).unwrap();
        let back: ResultTable =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, table());
    }

    #[test]
    fn csv_values_parse_back_to_the_same_f64() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.csv");
        write_results(&p, &table()).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("metric,level,level_name,value,queries,skipped")
        );
        let r1: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(r1[..3], ["R@1", "0", "class_id"]);
        assert_eq!(r1[3].parse::<f64>().unwrap(), 586.0 / 600.0);
        let hap: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(hap[1], "");
        assert_eq!(hap[3].parse::<f64>().unwrap(), 0.1 + 0.2);
        assert_eq!(hap[4..], ["2", "1"]);
    }

    #[test]
    fn a_comparison_adds_its_fields_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table();
        t.rows[0].versus = Some(Versus {
            value: 0.7,
            difference: 0.1 + 0.2,
            interval_low: 0.05,
            interval_high: 586.0 / 600.0,
            p: 0.0123,
            queries: 3,
        });
        // Fewer than two queries: no interval (null / empty), still written.
        t.rows[1].versus = Some(Versus {
            value: 0.25,
            difference: 0.5,
            interval_low: f64::NAN,
            interval_high: f64::NAN,
            p: 1.0,
            queries: 1,
        });
        let p = dir.path().join("r.json");
        write_results(&p, &t).unwrap();
        let back: ResultTable =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back.rows[0], t.rows[0]);
        let v = back.rows[1].versus.as_ref().unwrap();
        assert!(v.interval_low.is_nan() && v.interval_high.is_nan());
        assert_eq!((v.value, v.difference, v.queries), (0.25, 0.5, 1));
        // Without a comparison the field is absent, as before.
        write_results(&p, &table()).unwrap();
        assert!(!std::fs::read_to_string(&p).unwrap().contains("versus"));
        let p = dir.path().join("r.csv");
        write_results(&p, &t).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "metric,level,level_name,value,queries,skipped,versus_value,difference,\
                 interval_low,interval_high,p,versus_queries"
            )
        );
        let r1: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(r1[7].parse::<f64>().unwrap(), 0.1 + 0.2);
        assert_eq!(r1[9].parse::<f64>().unwrap(), 586.0 / 600.0);
        assert_eq!(r1[10..], ["0.0123", "3"]);
        let hap: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(hap[6..], ["0.25", "0.5", "", "", "1", "1"]);
        // A tiny p-value in scientific notation, to the same f64.
        t.rows[0].versus.as_mut().unwrap().p = 9.290598626600092e-157;
        write_results(&p, &t).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let r1: Vec<&str> = text.lines().nth(1).unwrap().split(',').collect();
        assert_eq!(r1[10], "9.290598626600092e-157");
        assert_eq!(r1[10].parse::<f64>().unwrap(), 9.290598626600092e-157);
    }

    #[test]
    fn refuses_unknown_formats_and_nan() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_results(&dir.path().join("r.txt"), &table()).unwrap_err();
        assert!(e.to_string().contains(".json or .csv"), "{e}");
        let mut t = table();
        t.rows[1].value = f64::NAN;
        let p = dir.path().join("r.json");
        let e = write_results(&p, &t).unwrap_err().to_string();
        assert!(e.contains("H-AP") && e.contains("NaN"), "{e}");
        assert!(!p.exists());
        t.rows[1].value = f64::INFINITY;
        assert!(write_results(&p, &t).is_err());
    }

    #[test]
    fn a_metric_with_no_counted_query_is_null() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table();
        t.rows[1].value = f64::NAN;
        t.rows[1].queries = 0;
        let p = dir.path().join("r.json");
        write_results(&p, &t).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("\"value\": null"), "{text}");
        let back: ResultTable = serde_json::from_str(&text).unwrap();
        assert!(back.rows[1].value.is_nan());
        assert_eq!(back.rows[0], t.rows[0]);
        let p = dir.path().join("r.csv");
        write_results(&p, &t).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("H-AP,,,,0,1"), "{text}");
    }
}

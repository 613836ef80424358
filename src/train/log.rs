//! The metrics log of a training run: one tidy row per (epoch, step, split, metric, level),
//! exported as a polars `DataFrame`, CSV or parquet (both written atomically).

use super::checkpoint::write_atomic;
use crate::error::{Error, Result};
use polars::prelude::{Column, DataFrame, ParquetWriter};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One logged value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRow {
    /// Epochs completed when the value was recorded (0 = before training).
    pub epoch: u64,
    /// Optimizer steps completed when the value was recorded.
    pub step: u64,
    /// `train` (losses, learning rates, throughput) or the evaluated split (`test`).
    pub split: String,
    /// Metric name (`loss`, `lr/backbone`, `images_per_s`, `R@1`, `mAP@R`, `H-AP`, …).
    pub metric: String,
    /// Label column of a binary retrieval metric (0 = finest); empty otherwise.
    pub level: Option<usize>,
    /// The value.
    #[serde(with = "crate::io::json_f64")]
    pub value: f64,
}

/// The rows of a run, in the order they were recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsLog {
    rows: Vec<LogRow>,
}

impl MetricsLog {
    /// Appends a row.
    pub fn push(
        &mut self,
        epoch: u64,
        step: u64,
        split: &str,
        metric: &str,
        level: Option<usize>,
        value: f64,
    ) {
        self.rows.push(LogRow {
            epoch,
            step,
            split: split.to_string(),
            metric: metric.to_string(),
            level,
            value,
        });
    }

    /// All rows.
    pub fn rows(&self) -> &[LogRow] {
        &self.rows
    }

    /// `(epoch, value)` of every row of `split` / `metric` / `level`, in order.
    pub fn series(&self, split: &str, metric: &str, level: Option<usize>) -> Vec<(u64, f64)> {
        self.rows
            .iter()
            .filter(|r| r.split == split && r.metric == metric && r.level == level)
            .map(|r| (r.epoch, r.value))
            .collect()
    }

    /// The rows as a `DataFrame` with columns `epoch`, `step`, `split`, `metric`, `level`,
    /// `value`.
    pub fn to_dataframe(&self) -> Result<DataFrame> {
        let r = &self.rows;
        let columns = vec![
            Column::new(
                "epoch".into(),
                r.iter().map(|x| x.epoch).collect::<Vec<u64>>(),
            ),
            Column::new(
                "step".into(),
                r.iter().map(|x| x.step).collect::<Vec<u64>>(),
            ),
            Column::new(
                "split".into(),
                r.iter().map(|x| x.split.as_str()).collect::<Vec<&str>>(),
            ),
            Column::new(
                "metric".into(),
                r.iter().map(|x| x.metric.as_str()).collect::<Vec<&str>>(),
            ),
            Column::new(
                "level".into(),
                r.iter()
                    .map(|x| x.level.map(|l| l as u32))
                    .collect::<Vec<Option<u32>>>(),
            ),
            Column::new(
                "value".into(),
                r.iter().map(|x| x.value).collect::<Vec<f64>>(),
            ),
        ];
        DataFrame::new(r.len(), columns)
            .map_err(|e| Error::invalid("metrics log", format!("cannot build the table: {e}")))
    }

    /// Writes the log as CSV (header `epoch,step,split,metric,level,value`; an empty `level`
    /// for metrics without one; values with Rust's shortest round-trip formatting).
    pub fn write_csv(&self, path: &Path) -> Result<()> {
        let mut w = csv::Writer::from_writer(Vec::new());
        let csv_err = |e: csv::Error| Error::file(path, format!("cannot write CSV: {e}"));
        w.write_record(["epoch", "step", "split", "metric", "level", "value"])
            .map_err(csv_err)?;
        for r in &self.rows {
            w.write_record([
                r.epoch.to_string(),
                r.step.to_string(),
                r.split.clone(),
                r.metric.clone(),
                r.level.map(|l| l.to_string()).unwrap_or_default(),
                r.value.to_string(),
            ])
            .map_err(csv_err)?;
        }
        let bytes = w
            .into_inner()
            .map_err(|e| Error::file(path, format!("cannot write CSV: {e}")))?;
        write_atomic(path, &bytes)
    }

    /// Writes the log as parquet.
    pub fn write_parquet(&self, path: &Path) -> Result<()> {
        let mut df = self.to_dataframe()?;
        let mut bytes = Vec::new();
        ParquetWriter::new(&mut bytes)
            .finish(&mut df)
            .map_err(|e| Error::file(path, format!("cannot write parquet: {e}")))?;
        write_atomic(path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_dataframe_hold_every_row() {
        let mut log = MetricsLog::default();
        log.push(0, 0, "test", "R@1", Some(0), 0.25);
        log.push(1, 4, "train", "loss", None, 0.125);
        let df = log.to_dataframe().unwrap();
        assert_eq!(df.shape(), (2, 6));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        log.write_csv(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "epoch,step,split,metric,level,value\n0,0,test,R@1,0,0.25\n1,4,train,loss,,0.125\n"
        );
        assert_eq!(log.series("train", "loss", None), vec![(1, 0.125)]);
        let pq = dir.path().join("m.parquet");
        log.write_parquet(&pq).unwrap();
        assert!(std::fs::metadata(&pq).unwrap().len() > 0);
    }
}

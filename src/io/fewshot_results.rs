//! Few-shot results (`rankwise fewshot --out`) as JSON or CSV, written atomically: one row per
//! classifier and shot count, its accuracy over the episodes and its comparison with the first
//! classifier on the same episodes.
//!
//! Values use the shortest round-trip formatting, as the retrieval results do
//! ([`super::results`]): a file read back gives the very `f64` computed.

use super::atomic::write_atomically;
use super::results::{csv_f64, write_json, ResultFormat};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// One classifier's accuracy on one episode configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FewShotRow {
    /// N, classes per episode.
    pub ways: usize,
    /// K, support items per class.
    pub shots: usize,
    /// Query items per class.
    pub queries: usize,
    /// Episodes scored.
    pub episodes: usize,
    /// The classifier, in the form `--classifier` reads ([`crate::rerank::EpisodeMethod`]).
    pub classifier: String,
    /// For `k-reciprocal:grid`, the grid point chosen on these episodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen: Option<String>,
    /// Mean accuracy over the episodes, percent.
    pub accuracy: f64,
    /// Population standard deviation of the per-episode accuracies.
    pub std: f64,
    /// The few-shot literature's 95% half-width, `1.96 · std / √episodes`.
    pub half_width: f64,
    /// This classifier against the first one on the same episodes; absent for the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versus: Option<EpisodeVersus>,
}

/// A row's accuracy minus the first classifier's, episode by episode (the paired t-test over the
/// episodes, [`crate::stats::paired_t`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeVersus {
    /// The first classifier.
    pub classifier: String,
    /// Mean over the episodes of this row's accuracy minus the first classifier's (points).
    pub difference: f64,
    /// The 95% interval of `difference` (Student's t), lower end; null with one episode.
    #[serde(with = "crate::io::json_f64")]
    pub interval_low: f64,
    /// Its upper end.
    #[serde(with = "crate::io::json_f64")]
    pub interval_high: f64,
    /// The two-sided p-value of the paired t-test.
    pub p: f64,
}

/// A few-shot evaluation: its rows and the settings that produced them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FewShotTable {
    /// Inputs and options (files, label level, seed, …), for the record.
    pub settings: BTreeMap<String, String>,
    /// One row per shot count and classifier.
    pub rows: Vec<FewShotRow>,
}

/// Writes `table` to `path` (`.json`: the whole table; `.csv`: the rows with a header),
/// atomically. A non-finite accuracy is an error naming the classifier, never written.
///
/// ```
/// use rankwise::io::fewshot_results::{write_fewshot_results, FewShotRow, FewShotTable};
/// let row = FewShotRow {
///     ways: 5, shots: 1, queries: 15, episodes: 2000, classifier: "prototype".into(),
///     chosen: None, accuracy: 62.5, std: 9.0, half_width: 0.39, versus: None,
/// };
/// let table = FewShotTable { settings: Default::default(), rows: vec![row] };
/// let dir = tempfile::tempdir()?;
/// write_fewshot_results(&dir.path().join("fewshot.csv"), &table)?;
/// let text = std::fs::read_to_string(dir.path().join("fewshot.csv"))?;
/// assert!(text.starts_with("ways,shots,queries,episodes,classifier,chosen,accuracy"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_fewshot_results(path: &Path, table: &FewShotTable) -> Result<()> {
    let format = ResultFormat::from_path(path)?;
    if let Some(r) = table
        .rows
        .iter()
        .find(|r| !(r.accuracy.is_finite() && r.std.is_finite() && r.half_width.is_finite()))
    {
        return Err(Error::invalid(
            "results",
            format!(
                "{} ({}-way {}-shot): accuracy {} ± {}; refusing to write {}",
                r.classifier,
                r.ways,
                r.shots,
                r.accuracy,
                r.half_width,
                path.display()
            ),
        ));
    }
    match format {
        ResultFormat::Json => write_json(path, table),
        ResultFormat::Csv => write_atomically(path, |w| write_csv(w, &table.rows)),
    }
}

/// One classifier's accuracy on one episode (`rankwise fewshot --per-episode`).
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeAccuracy {
    /// N, classes per episode.
    pub ways: usize,
    /// K, support items per class.
    pub shots: usize,
    /// The episode's index: with the same labels, configuration and seed, episode `e` is the
    /// same support and queries whatever the features.
    pub episode: usize,
    /// The classifier, in the form `--classifier` reads.
    pub classifier: String,
    /// Accuracy on the episode's queries, percent.
    pub accuracy: f64,
}

/// Writes per-episode accuracies as CSV (`ways,shots,episode,classifier,accuracy`),
/// atomically: the raw values behind a [`FewShotTable`], to pair with another tool's or another
/// features file's accuracies on the same episodes. Errors on another extension than `.csv` and
/// on a non-finite accuracy (naming its classifier and episode).
///
/// ```
/// use rankwise::io::fewshot_results::{write_episode_accuracies, EpisodeAccuracy};
/// let rows = [EpisodeAccuracy { ways: 5, shots: 1, episode: 0, classifier: "prototype".into(), accuracy: 80.0 }];
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("episodes.csv");
/// write_episode_accuracies(&path, &rows)?;
/// assert_eq!(std::fs::read_to_string(&path)?, "ways,shots,episode,classifier,accuracy\n5,1,0,prototype,80\n");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_episode_accuracies(path: &Path, rows: &[EpisodeAccuracy]) -> Result<()> {
    if ResultFormat::from_path(path)? != ResultFormat::Csv {
        return Err(Error::invalid(
            "per-episode",
            format!(
                "{}: per-episode accuracies are written as .csv",
                path.display()
            ),
        ));
    }
    if let Some(r) = rows.iter().find(|r| !r.accuracy.is_finite()) {
        return Err(Error::invalid(
            "per-episode",
            format!(
                "{} on episode {} ({}-way {}-shot): accuracy {}; refusing to write {}",
                r.classifier,
                r.episode,
                r.ways,
                r.shots,
                r.accuracy,
                path.display()
            ),
        ));
    }
    write_atomically(path, |w| {
        let mut out = csv::Writer::from_writer(w);
        out.write_record(["ways", "shots", "episode", "classifier", "accuracy"])?;
        for r in rows {
            out.write_record([
                r.ways.to_string(),
                r.shots.to_string(),
                r.episode.to_string(),
                r.classifier.clone(),
                csv_f64(r.accuracy),
            ])?;
        }
        out.flush()
    })
}

fn write_csv(w: &mut dyn Write, rows: &[FewShotRow]) -> std::io::Result<()> {
    let mut out = csv::Writer::from_writer(w);
    out.write_record([
        "ways",
        "shots",
        "queries",
        "episodes",
        "classifier",
        "chosen",
        "accuracy",
        "std",
        "half_width",
        "versus",
        "difference",
        "interval_low",
        "interval_high",
        "p",
    ])?;
    for r in rows {
        let mut record = vec![
            r.ways.to_string(),
            r.shots.to_string(),
            r.queries.to_string(),
            r.episodes.to_string(),
            r.classifier.clone(),
            r.chosen.clone().unwrap_or_default(),
            csv_f64(r.accuracy),
            csv_f64(r.std),
            csv_f64(r.half_width),
        ];
        match &r.versus {
            Some(v) => record.extend([
                v.classifier.clone(),
                csv_f64(v.difference),
                csv_f64(v.interval_low),
                csv_f64(v.interval_high),
                csv_f64(v.p),
            ]),
            None => record.extend(std::iter::repeat_n(String::new(), 5)),
        }
        out.write_record(&record)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> FewShotTable {
        let row = |classifier: &str, accuracy: f64, versus: Option<EpisodeVersus>| FewShotRow {
            ways: 5,
            shots: 1,
            queries: 15,
            episodes: 3,
            classifier: classifier.into(),
            chosen: None,
            accuracy,
            std: 0.1,
            half_width: 0.2,
            versus,
        };
        FewShotTable {
            settings: BTreeMap::from([("seed".to_string(), "0".to_string())]),
            rows: vec![
                row("prototype", 0.1 + 0.2, None),
                row(
                    "soft-kmeans:1,10",
                    61.0,
                    Some(EpisodeVersus {
                        classifier: "prototype".into(),
                        difference: 1.0 / 3.0,
                        interval_low: f64::NAN,
                        interval_high: 2.5,
                        p: 3e-20,
                    }),
                ),
            ],
        }
    }

    #[test]
    fn json_round_trips_and_csv_has_every_column() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        let t = table();
        write_fewshot_results(&json, &t).unwrap();
        let back: FewShotTable =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(back.rows[0], t.rows[0]);
        let (v, w) = (
            back.rows[1].versus.as_ref().unwrap(),
            t.rows[1].versus.as_ref().unwrap(),
        );
        assert!(v.interval_low.is_nan());
        assert_eq!(
            (v.difference, v.interval_high, v.p),
            (w.difference, w.interval_high, w.p)
        );
        let csv = dir.path().join("r.csv");
        write_fewshot_results(&csv, &t).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[1],
            "5,1,15,3,prototype,,0.30000000000000004,0.1,0.2,,,,,"
        );
        assert_eq!(
            lines[2],
            "5,1,15,3,\"soft-kmeans:1,10\",,61,0.1,0.2,prototype,0.3333333333333333,,2.5,3e-20"
        );
    }

    #[test]
    fn refuses_a_non_finite_accuracy_and_an_unknown_format() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = table();
        t.rows[1].accuracy = f64::NAN;
        let e = write_fewshot_results(&dir.path().join("r.json"), &t).unwrap_err();
        assert!(e.to_string().contains("soft-kmeans:1,10"), "{e}");
        assert!(!dir.path().join("r.json").exists());
        let e = write_fewshot_results(&dir.path().join("r.txt"), &table()).unwrap_err();
        assert!(e.to_string().contains("r.txt"), "{e}");
    }
}

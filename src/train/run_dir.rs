//! A training run written to a folder, what `rankwise train` does: the resolved configuration
//! (`config.toml`), the metrics log (`metrics.csv`, `metrics.parquet`), the checkpoint
//! (`checkpoint.safetensors`) and the final evaluation (`results.json`), every file written
//! atomically.

use super::config::TrainConfig;
use super::log::LogRow;
use super::trainer::{Trainer, CHECKPOINT_FILE};
use crate::error::{Error, Result};
use crate::io::write_atomically;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The resolved configuration's file name in a run folder.
pub const CONFIG_FILE: &str = "config.toml";
/// The final evaluation's file name in a run folder.
pub const RESULTS_FILE: &str = "results.json";

/// `results.json`: the evaluations of the untrained and of the trained network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    /// The recipe the run was started from (before `--set` overrides, which `config.toml`
    /// records resolved).
    pub recipe: Option<PathBuf>,
    /// Epochs trained in total (including those before a resume).
    pub epochs: u64,
    /// Optimizer steps in total.
    pub steps: u64,
    /// Wall-clock seconds of this session (data loading, training and evaluations).
    pub wall_seconds: f64,
    /// Epoch of the last evaluation (the `final` rows).
    pub final_epoch: u64,
    /// Every metric of the last evaluation (every test split of the protocol).
    pub final_metrics: Vec<LogRow>,
    /// Every metric of the evaluation before training (epoch 0), if it ran.
    pub untrained_metrics: Vec<LogRow>,
    /// Fine-level R@1 on the first test split before training, if evaluated.
    pub r_at_1_untrained: Option<f64>,
    /// Fine-level R@1 on the first test split after the last evaluation.
    pub r_at_1_final: Option<f64>,
}

/// Options of [`train_to_dir`] beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The recipe file, recorded in `results.json`.
    pub recipe: Option<PathBuf>,
    /// Continue from `<dir>/checkpoint.safetensors`.
    pub resume: bool,
}

/// Trains `config` into `dir` (created if needed): writes `config.toml` once the trainer is
/// built, then the
/// metrics and checkpoints as the run goes ([`Trainer::fit`]), and `results.json` at the end.
/// With `options.resume`, training continues from the folder's checkpoint (an error naming it
/// if it is missing).
pub fn train_to_dir(
    mut config: TrainConfig,
    dir: &Path,
    options: &RunOptions,
) -> Result<RunResults> {
    let started = Instant::now();
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    config.output.dir = Some(dir.to_path_buf());
    if options.resume {
        let checkpoint = dir.join(CHECKPOINT_FILE);
        if !checkpoint.is_file() {
            return Err(Error::file(
                &checkpoint,
                "--resume: no checkpoint in the run folder (train without --resume first)",
            ));
        }
        config.resume = Some(checkpoint);
    }
    config.validate()?;
    let toml = config.to_toml_string()?;
    // Built first (data, model, pretrained weights, checkpoint checks), so that a run refused
    // here leaves the folder's config.toml as it was.
    let mut trainer = Trainer::from_config(config)?;
    write_atomically(&dir.join(CONFIG_FILE), |w| w.write_all(toml.as_bytes()))?;
    trainer.fit()?;
    let results = summarize(&trainer, options, started.elapsed().as_secs_f64());
    let json = serde_json::to_string_pretty(&results)
        .map_err(|e| Error::invalid("results", e.to_string()))?;
    write_atomically(&dir.join(RESULTS_FILE), |w| {
        w.write_all(json.as_bytes())?;
        w.write_all(b"\n")
    })?;
    Ok(results)
}

/// The results of a trained [`Trainer`] from its metrics log.
pub fn summarize(trainer: &Trainer<'_>, options: &RunOptions, wall_seconds: f64) -> RunResults {
    let log = trainer.log().rows();
    let evals: Vec<&LogRow> = log.iter().filter(|r| r.split != "train").collect();
    let final_epoch = evals.iter().map(|r| r.epoch).max().unwrap_or(0);
    let at = |epoch: u64| -> Vec<LogRow> {
        evals
            .iter()
            .filter(|r| r.epoch == epoch)
            .map(|r| (*r).clone())
            .collect()
    };
    let untrained_metrics = if evals.iter().any(|r| r.epoch == 0) {
        at(0)
    } else {
        Vec::new()
    };
    let first_split = trainer
        .test_protocol()
        .sets()
        .first()
        .map(|s| s.split.clone())
        .unwrap_or_else(|| "test".into());
    let r1 = |rows: &[LogRow]| {
        rows.iter()
            .find(|r| r.split == first_split && r.metric == "R@1" && r.level == Some(0))
            .map(|r| r.value)
    };
    let final_metrics = at(final_epoch);
    RunResults {
        recipe: options.recipe.clone(),
        epochs: trainer.epochs_done(),
        steps: trainer.global_step(),
        wall_seconds,
        final_epoch,
        r_at_1_untrained: r1(&untrained_metrics),
        r_at_1_final: r1(&final_metrics),
        final_metrics,
        untrained_metrics,
    }
}

/// Reads a run folder's `results.json`.
pub fn read_results(dir: &Path) -> Result<RunResults> {
    let path = dir.join(RESULTS_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(&path, e.to_string()))
}

//! A training run written to a folder, what `rankwise train` does: the resolved configuration
//! (`config.toml`), the metrics log (`metrics.csv`, `metrics.parquet`), the checkpoint
//! (`checkpoint.safetensors`; with a `[validation]` table also `best.safetensors`, the network
//! of the selected epoch) and the final evaluation (`results.json`), every file written
//! atomically.
//!
//! A run folder has one writer and one run: [`train_to_dir`] holds the folder's lock
//! ([`RunLock`]) while it writes, refuses a folder that already holds a run unless told to resume
//! or overwrite it ([`Reuse`]), and checks the whole recipe — data, model, weights, sampler,
//! optimizer and the checkpoint to resume — before it creates or changes anything.

use super::config::TrainConfig;
use super::log::LogRow;
use super::overrides::blame;
use super::trainer::{
    Trainer, BEST_CHECKPOINT_FILE, CHECKPOINT_FILE, METRICS_CSV, METRICS_PARQUET,
};
use super::validation::Selection;
use crate::error::{Error, Result};
use crate::io::write_atomically;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The resolved configuration's file name in a run folder.
pub const CONFIG_FILE: &str = "config.toml";
/// The final evaluation's file name in a run folder.
pub const RESULTS_FILE: &str = "results.json";
/// The lock file of a run folder, present while a process writes the run.
pub const LOCK_FILE: &str = "run.lock";
/// The files of a run: a folder holding any of them holds a run.
pub const RUN_FILES: [&str; 6] = [
    CONFIG_FILE,
    CHECKPOINT_FILE,
    BEST_CHECKPOINT_FILE,
    METRICS_CSV,
    METRICS_PARQUET,
    RESULTS_FILE,
];

/// `results.json`: the evaluations of the untrained and of the trained network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    /// The recipe the run was started from (before `--set` overrides, which `config.toml`
    /// records resolved).
    pub recipe: Option<PathBuf>,
    /// The `--set` overrides of this session, in order.
    #[serde(default)]
    pub overrides: Vec<String>,
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
    /// With a `[validation]` table: the epoch the held-out classes selected and its test
    /// metrics (its network is `best.safetensors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
}

/// What [`train_to_dir`] does with a folder that already holds a run ([`RUN_FILES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reuse {
    /// Refuse it (the default): a run is never silently replaced.
    #[default]
    Refuse,
    /// Continue it from its `checkpoint.safetensors` (`rankwise train --resume`): the same
    /// recipe, with at least as many epochs as the checkpoint has done.
    Resume,
    /// Replace it (`rankwise train --overwrite`): its run files are removed once the new run's
    /// recipe has been checked, before the new run writes its own.
    Overwrite,
}

/// Options of [`train_to_dir`] beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The recipe file, recorded in `results.json`.
    pub recipe: Option<PathBuf>,
    /// The `--set` overrides the configuration was resolved with: recorded in `results.json`,
    /// and named by an error about the field they set ([`super::overrides::blame`]).
    pub overrides: Vec<String>,
    /// What to do with a folder that already holds a run.
    pub reuse: Reuse,
}

/// Trains `config` into `dir`.
///
/// In order: checks the folder against `options.reuse` (under its lock if it exists), validates
/// the configuration and builds the trainer (data, model, pretrained weights, sampler, optimizer,
/// and with [`Reuse::Resume`] the folder's checkpoint, whose epochs must not exceed
/// `config.epochs`) — an error here names the `--set` override it comes from and leaves no folder
/// and no file changed — then creates and locks the folder, removes the temporary files of
/// earlier interrupted writes (and with [`Reuse::Overwrite`] the old run's files), writes
/// `config.toml`, trains ([`Trainer::fit`]: metrics and checkpoints as the run goes) and writes
/// `results.json`.
pub fn train_to_dir(
    mut config: TrainConfig,
    dir: &Path,
    options: &RunOptions,
) -> Result<RunResults> {
    let started = Instant::now();
    let blamed = |e: Error| blame(e, &options.overrides);
    crate::io::check_output_dir(dir)?;
    config.output.dir = Some(dir.to_path_buf());
    // A folder that exists is locked before it is looked at, so that its contents cannot change
    // between the check and the writes; one that does not is only created once the recipe is
    // known to be good.
    let mut lock = if dir.is_dir() {
        Some(RunLock::acquire(dir)?)
    } else {
        None
    };
    check_reuse(dir, options.reuse)?;
    if options.reuse == Reuse::Resume {
        config.resume = Some(dir.join(CHECKPOINT_FILE));
    }
    config.validate().map_err(blamed)?;
    config.device.check_available().map_err(blamed)?;
    let toml = config.to_toml_string()?;
    let mut trainer = Trainer::from_config(config).map_err(blamed)?;
    let target = trainer.config().epochs;
    if options.reuse == Reuse::Resume && trainer.epochs_done() > target {
        return Err(blamed(Error::invalid(
            "epochs",
            format!(
                "the run in {} has already trained {} epochs, more than epochs = {target}: \
                 resume with epochs ≥ {} (or train into another folder)",
                dir.display(),
                trainer.epochs_done(),
                trainer.epochs_done()
            ),
        )));
    }
    if lock.is_none() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        lock = Some(RunLock::acquire(dir)?);
        // Another process may have started a run here since the first check.
        check_reuse(dir, options.reuse)?;
    }
    let removed = remove_temporaries(dir)?;
    if trainer.config().progress && !removed.is_empty() {
        eprintln!(
            "{}: removed {} temporary file(s) left by an interrupted write: {}",
            dir.display(),
            removed.len(),
            removed.join(", ")
        );
    }
    if options.reuse == Reuse::Overwrite {
        for name in RUN_FILES {
            let path = dir.join(name);
            if path.exists() {
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
    }
    write_atomically(&dir.join(CONFIG_FILE), |w| w.write_all(toml.as_bytes()))?;
    trainer.fit()?;
    let results = summarize(&trainer, options, started.elapsed().as_secs_f64())?;
    let json = serde_json::to_string_pretty(&results)
        .map_err(|e| Error::invalid("results", e.to_string()))?;
    write_atomically(&dir.join(RESULTS_FILE), |w| {
        w.write_all(json.as_bytes())?;
        w.write_all(b"\n")
    })?;
    drop(lock);
    Ok(results)
}

/// The [`RUN_FILES`] present in `dir` (none when it does not exist).
pub fn run_files_in(dir: &Path) -> Vec<&'static str> {
    RUN_FILES
        .into_iter()
        .filter(|name| dir.join(name).exists())
        .collect()
}

/// Checks the folder `dir` against `reuse`: a folder holding a run is refused unless resumed or
/// overwritten; a resume needs the run's checkpoint.
fn check_reuse(dir: &Path, reuse: Reuse) -> Result<()> {
    let present = run_files_in(dir);
    match reuse {
        Reuse::Refuse if !present.is_empty() => Err(Error::file(
            dir,
            format!(
                "the folder holds a run ({}): pass --resume to continue it or --overwrite to \
                 replace it, or choose another --out",
                present.join(", ")
            ),
        )),
        Reuse::Resume if !dir.join(CHECKPOINT_FILE).is_file() => Err(Error::file(
            dir.join(CHECKPOINT_FILE),
            "--resume: no checkpoint in the run folder (train without --resume first)",
        )),
        _ => Ok(()),
    }
}

/// Whether `name` is a temporary file of an atomic write of a run file: `.<file>.<random>.tmp`
/// ([`write_atomically`]) or `<file>.tmp.<pid>` (the checkpoint writer of earlier versions).
fn is_temporary(name: &str) -> bool {
    RUN_FILES.iter().any(|file| {
        let current = name
            .strip_prefix(&format!(".{file}."))
            .is_some_and(|rest| rest.ends_with(".tmp"));
        let earlier = name
            .strip_prefix(&format!("{file}.tmp."))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        current || earlier
    })
}

/// Removes the temporary files of run files in `dir` (a write killed before its rename leaves
/// one) and returns their names. Only called under the folder's lock: no other process writes
/// there, so every such file belongs to a write that died.
fn remove_temporaries(dir: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if is_temporary(&name) && entry.path().is_file() {
            std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}

/// The exclusive lock of a run folder: the operating system's lock on `<dir>/run.lock` (released
/// when the process ends, even by `kill -9`, so a crashed run never blocks the folder), holding
/// the process id and start time for the message another process shows. The file is removed
/// when the lock is dropped.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    file: File,
}

impl RunLock {
    /// Takes the lock of the existing folder `dir`, or fails at once naming the folder and the
    /// process that holds it.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let path = dir.join(LOCK_FILE);
        loop {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    return Err(Error::file(
                        dir,
                        format!(
                            "the run folder is in use by another process ({}): wait for it to \
                             finish, or train into another --out",
                            holder.trim()
                        ),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            }
            // The holder before us removes the file when it lets go: if it did so between our
            // open and our lock, we hold a lock on a file no longer in the folder. Start again.
            if !same_file(&file, &path) {
                continue;
            }
            let note = format!(
                "pid {} since {} s after the Unix epoch",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
            );
            file.set_len(0).map_err(|e| Error::io(&path, e))?;
            file.write_all(note.as_bytes())
                .map_err(|e| Error::io(&path, e))?;
            return Ok(RunLock { path, file });
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked, so that a process waiting on this file sees it gone
        // (`same_file`) rather than taking a lock on a file that no longer guards the folder.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

/// Whether the open `file` is the file now at `path`.
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether the open `file` is the file now at `path` (without inode numbers: whether a file is
/// there at all).
#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.is_file()
}

/// The results of a trained [`Trainer`] from its metrics log.
pub fn summarize(
    trainer: &Trainer<'_>,
    options: &RunOptions,
    wall_seconds: f64,
) -> Result<RunResults> {
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
    Ok(RunResults {
        recipe: options.recipe.clone(),
        overrides: options.overrides.clone(),
        epochs: trainer.epochs_done(),
        steps: trainer.global_step(),
        wall_seconds,
        final_epoch,
        r_at_1_untrained: r1(&untrained_metrics),
        r_at_1_final: r1(&final_metrics),
        final_metrics,
        untrained_metrics,
        selection: trainer.selection()?,
    })
}

/// Reads a run folder's `results.json`.
pub fn read_results(dir: &Path) -> Result<RunResults> {
    let path = dir.join(RESULTS_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(&path, e.to_string()))
}

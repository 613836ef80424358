//! One training run of an experiment — a recipe trained to the end and evaluated — and the
//! on-disk cache that lets tables share runs.
//!
//! Many cells of the papers' tables are the same run (Smooth-AP with τ = 0.01 is a row of the
//! main comparison and the centre of the τ, |P| and batch-size ablations; HAPPIER's default run
//! appears in Tables 1, 3, 5 and in both sweeps of Fig. 4). A [`Runner`] keys each run by the
//! full TOML text of its recipe and the crate version, stores its result as JSON (atomically) and
//! returns the stored result the next time the same recipe is asked for, in this notebook or
//! another one. Nothing else is cached, save one thing: a fold run of a cross-validation keeps
//! its selected epoch's test embeddings beside its result ([`Runner::selected_test_embeddings`]),
//! the members of the fold models' ensemble. A changed hyperparameter is a new run.

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::io::write_atomically;
use crate::retrieval::ensemble::TestEmbeddings;
use crate::train::validation::{select, Selection};
use crate::train::{LogRow, TrainConfig, Trainer, ValidationConfig};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The hash of the code a training run executes: every file under `src/` except
/// `src/experiments/` and `src/report/` (which only turn finished runs into tables), plus
/// `Cargo.lock`; computed by `build.rs`. Part of every cached run's key and recorded in it.
pub const RUN_CODE: &str = env!("RANKWISE_RUN_CODE");

/// What a finished run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The run's label in the experiment (e.g. `smooth_ap tau=0.1`).
    pub label: String,
    /// The recipe, as TOML (the cache key, with the crate version).
    pub recipe: String,
    /// The final evaluation.
    pub metrics: Vec<MetricValue>,
    /// The metrics log of the run (training losses, evaluations after each epoch).
    pub log: Vec<LogRow>,
    /// Wall time of the training and evaluations, in seconds.
    pub seconds: f64,
    /// Number of test queries of the final evaluation.
    pub test_queries: usize,
    /// The recipe's seed (initial weights and batches).
    pub seed: u64,
    /// The device it trained on (`cpu`, `cuda`).
    pub device: String,
    /// [`RUN_CODE`] of the build that trained it.
    pub code: String,
}

impl RunResult {
    /// The final value of `metric` at `level`; an error naming the run if it was not measured.
    pub fn metric(&self, metric: &str, level: Option<usize>) -> Result<f64> {
        self.metrics
            .iter()
            .find(|m| m.metric == metric && m.level == level)
            .map(|m| m.value)
            .ok_or_else(|| {
                Error::invalid(
                    "metric",
                    format!(
                        "run `{}` has no {metric}{}",
                        self.label,
                        level.map_or(String::new(), |l| format!(" at level {l}"))
                    ),
                )
            })
    }

    /// This run read at the epoch its held-out classes selected ([`crate::train::validation`]):
    /// `metrics` are the test metrics of that epoch (of the same test split as the final ones),
    /// and the epoch. Errors naming the run when its log has no validation value of
    /// `validation`'s metric (a run trained without that `[validation]` table).
    pub fn selected(&self, validation: &ValidationConfig) -> Result<(RunResult, u64)> {
        let selection = self.selection(validation)?;
        Ok((self.at_selection(&selection), selection.epoch))
    }

    /// This run with `metrics` replaced by the test metrics of `selection` (one of this run's
    /// [`RunResult::selection`]s), of the same test split as the final ones.
    pub fn at_selection(&self, selection: &Selection) -> RunResult {
        // The final metrics are the first test set's (`Runner::train`).
        let metrics = selection
            .first_test_set()
            .map(|r| MetricValue {
                metric: r.metric.clone(),
                level: r.level,
                value: r.value,
            })
            .collect();
        RunResult {
            metrics,
            ..self.clone()
        }
    }

    /// The evaluation this run's held-out classes selected ([`select`]: the epoch, its
    /// validation value of `validation`'s metric and its test metrics). Errors naming the run
    /// when its log has no validation value of that metric.
    pub fn selection(&self, validation: &ValidationConfig) -> Result<Selection> {
        let (metric, level) = validation.metric()?;
        select(&self.log, &metric, level).ok_or_else(|| {
            Error::invalid(
                "run",
                format!(
                    "`{}` has no validation value of {} (trained without a [validation] table?)",
                    self.label, validation.metric
                ),
            )
        })
    }

    /// `(epoch, value)` of a test metric over training (epoch 0 = before training).
    pub fn curve(&self, metric: &str, level: Option<usize>) -> Vec<(u64, f64)> {
        self.log
            .iter()
            .filter(|r| r.split == "test" && r.metric == metric && r.level == level)
            .map(|r| (r.epoch, r.value))
            .collect()
    }

    /// The mean training loss of each epoch.
    pub fn loss_curve(&self) -> Vec<(u64, f64)> {
        self.log
            .iter()
            .filter(|r| r.split == "train" && r.metric == "loss_mean")
            .map(|r| (r.epoch, r.value))
            .collect()
    }
}

/// One metric of a run's final evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricValue {
    /// Metric name (`R@1`, `mAP@R`, `H-AP`, …).
    pub metric: String,
    /// The label column of a binary metric (0 = finest), `None` for H-AP, ASI and NDCG.
    pub level: Option<usize>,
    /// The value (NaN when no query could be counted).
    #[serde(with = "crate::io::json_f64")]
    pub value: f64,
}

/// A labelled recipe to run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// Label (for progress lines and error messages).
    pub label: String,
    /// The recipe (its loss included).
    pub config: TrainConfig,
}

/// Trains recipes, caching the results on disk (see the module documentation).
#[derive(Debug, Clone)]
pub struct Runner {
    cache_dir: Option<PathBuf>,
    verbose: bool,
    /// The per-run lines go to standard error ([`Runner::progress_on_stderr`]).
    stderr: bool,
    /// The run codes whose runs are read back, in the order they are looked for
    /// ([`Runner::reading_runs_of`]); empty: this build's, and a missing run trains.
    runs_of: Vec<String>,
}

impl Runner {
    /// A runner caching into `cache_dir` (`None`: no cache). `verbose` prints one line per run
    /// on standard output (progress bars are off: notebooks show standard output only).
    pub fn new(cache_dir: Option<PathBuf>, verbose: bool) -> Self {
        Runner {
            cache_dir,
            verbose,
            stderr: false,
            runs_of: Vec::new(),
        }
    }

    /// The same runner printing its per-run lines on standard error, for a command whose
    /// standard output is its result (`rankwise compare`).
    pub fn progress_on_stderr(mut self) -> Self {
        self.stderr = true;
        self
    }

    /// One progress line, where this runner prints them (nothing unless verbose).
    fn say(&self, line: std::fmt::Arguments<'_>) {
        match (self.verbose, self.stderr) {
            (false, _) => {}
            (true, false) => println!("{line}"),
            (true, true) => eprintln!("{line}"),
        }
    }

    /// The same runner reading back the runs that the code `code` trained (16 hex digits, as
    /// `rankwise --version` prints [`RUN_CODE`] and every table names it) instead of this
    /// build's, **training none**: a run of the recipe that `code` did not leave in the cache is
    /// an error naming it. Why: every change of the training code is a new [`RUN_CODE`], so
    /// without this the committed `standard` runs (hours of training, in
    /// `paper_tables/standard/runs/`) could only be re-read by the build that trained them;
    /// with it, a later build re-reads them into tables (whose provenance names `code`, the
    /// code that trained the numbers) and never mixes them with runs of its own.
    ///
    /// Called again, it adds a code: each run is read from the first code, in the order named,
    /// whose run of that recipe is in the cache — the committed runs of one code, and the rows
    /// added since trained by a later one. Every row of a table names the codes of its own runs
    /// (their provenance), so a table read so says which code trained what. Naming this
    /// build's [`RUN_CODE`] among them lets a run that no code has train now under this build's
    /// code (what trains the rows a table gained since the committed runs, and only those);
    /// naming it alone is the ordinary runner. An error if `code` is not 16 hex digits or the
    /// runner has no cache.
    pub fn reading_runs_of(mut self, code: &str) -> Result<Self> {
        if code.len() != 16 || !code.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                "run code",
                format!("expected 16 hex digits (as `rankwise --version` prints it), got {code:?}"),
            ));
        }
        if self.cache_dir.is_none() {
            return Err(Error::invalid(
                "run code",
                format!("runs of {code} are read from a run cache, and this runner has none"),
            ));
        }
        let code = code.to_ascii_lowercase();
        if !self.runs_of.contains(&code) {
            self.runs_of.push(code);
        }
        Ok(self)
    }

    /// The run codes whose runs this runner reads, in the order it looks for a run: this
    /// build's [`RUN_CODE`] unless [`Runner::reading_runs_of`] named others.
    pub fn run_codes(&self) -> Vec<&str> {
        if self.runs_of.is_empty() {
            vec![RUN_CODE]
        } else {
            self.runs_of.iter().map(String::as_str).collect()
        }
    }

    /// [`Runner::run_codes`] as one text, joined by `+` (one code for an ordinary runner).
    pub fn run_code(&self) -> String {
        self.run_codes().join("+")
    }

    /// Whether a run missing from the cache trains now: `false` for a runner reading other
    /// codes' runs unless this build's [`RUN_CODE`] is among them.
    pub fn trains(&self) -> bool {
        self.run_codes().contains(&RUN_CODE)
    }

    /// Whether this runner reads this build's runs only, training what is missing. A
    /// measurement that trains outside the runner (SSR's replicates) must refuse to run beside
    /// any other runner, or its table would mix codes it cannot name.
    pub fn reads_this_build_only(&self) -> bool {
        self.run_codes() == [RUN_CODE]
    }

    /// The error for a run that a runner reading another code's runs does not find.
    fn not_cached(&self, label: &str) -> Error {
        let dir = self
            .cache_dir
            .as_deref()
            .map_or_else(String::new, |d| format!(" in {}", d.display()));
        Error::invalid(
            "run",
            format!(
                "`{label}`: no run of run code {}{dir}; runs of another code than this \
                 build's ({RUN_CODE}) are read back, never trained (`scripts/standard_runs.sh \
                 load` unpacks the committed standard runs; to train what they lack, name this \
                 build's code too; to train everything, leave out the run codes)",
                self.run_codes().join(" or ")
            ),
        )
    }

    /// The cache folder, if any.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// The recipe of `spec` as the cache keys it: outputs, resume and progress bars do not
    /// change the result, so they are left out; pretrained weights on disk are keyed by their
    /// bytes, not their path ([`content_key`]), so that new weights at the same path are a new
    /// run and the same weights under another folder (another machine's cache) are the same
    /// one. Returns the recipe to train (its real paths) and the key.
    fn keyed(spec: &RunSpec) -> Result<(TrainConfig, String)> {
        let mut config = spec.config.clone();
        config.output = Default::default();
        config.resume = None;
        config.progress = false;
        let mut key = config.clone();
        if let Some(path) = config.pretrained.as_deref().filter(|p| p.is_file()) {
            key.pretrained = Some(PathBuf::from(content_key(path)?));
        }
        let recipe = key.to_toml_string()?;
        Ok((config, recipe))
    }

    /// The file name (without extension) of the run keyed `recipe` trained by the run code
    /// `code`: the hash of the recipe, the crate version and the code.
    fn key_name(code: &str, recipe: &str) -> String {
        let key = format!(
            "rankwise {} code {code}\n{recipe}",
            env!("CARGO_PKG_VERSION"),
        );
        format!("{:016x}", fnv1a(key.as_bytes()))
    }

    /// Where the result of the recipe keyed `recipe`, trained by `code`, is cached (`None`
    /// without a cache).
    fn result_path(&self, code: &str, recipe: &str) -> Option<PathBuf> {
        self.cache_dir
            .as_ref()
            .map(|d| d.join(format!("{}.json", Self::key_name(code, recipe))))
    }

    /// Where the run keyed `recipe`, trained by `code`, keeps its selected epoch's test
    /// embeddings ([`keeps_test_embeddings`]): beside its result in the cache, or without a
    /// cache in the system's temporary folder (as [`Runner::pretrained_backbone`]'s weights).
    fn embeddings_path(&self, code: &str, recipe: &str) -> PathBuf {
        let dir = match &self.cache_dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join("rankwise-test-embeddings"),
        };
        dir.join(format!(
            "{}.{EMBEDDINGS_SUFFIX}",
            Self::key_name(code, recipe)
        ))
    }

    /// The result of `spec`: from the cache if the same recipe was run by one of the codes read
    /// ([`Runner::run_codes`], the first that has it), otherwise trained now (and cached) by
    /// this build — or, when this build's code is not among them, an error. A fold run of a
    /// cross-validation ([`keeps_test_embeddings`]) also keeps its selected epoch's test
    /// embeddings ([`Runner::selected_test_embeddings`]); its cached result without them is a
    /// miss.
    pub fn run(&self, spec: &RunSpec) -> Result<RunResult> {
        let (config, recipe) = Self::keyed(spec)?;
        let keeps = keeps_test_embeddings(&config);
        let mut without_embeddings = None;
        for code in self.run_codes() {
            let path = self.result_path(code, &recipe);
            let embeddings = self.embeddings_path(code, &recipe);
            if !keeps || embeddings.is_file() {
                if let Some(hit) = self.cached(path.as_deref(), spec, &recipe, code)? {
                    return Ok(hit);
                }
            } else if path.as_deref().is_some_and(Path::is_file) {
                without_embeddings.get_or_insert((code, embeddings));
            }
        }
        if let (false, Some((code, embeddings))) = (self.trains(), without_embeddings) {
            // Reading other codes' runs: say what is missing, not that the run is.
            return Err(Error::file(
                &embeddings,
                format!(
                    "`{}`: the cached fold run of run code {code} has no test embeddings \
                     beside its result, and runs of another code than this build's are read \
                     back, never trained",
                    spec.label,
                ),
            ));
        }
        let (result, trainer) = self.train(spec, config, recipe.clone())?;
        if keeps {
            // Written before the result: a cached result of a fold run has its embeddings.
            let (epoch, kept) = trainer.selected_test_embeddings().ok_or_else(|| {
                Error::invalid(
                    "run",
                    format!(
                        "`{}` selected no epoch to keep the test embeddings of",
                        spec.label
                    ),
                )
            })?;
            save_embeddings(
                &self.embeddings_path(RUN_CODE, &recipe),
                kept,
                epoch,
                &result.label,
            )?;
        }
        store(self.result_path(RUN_CODE, &recipe).as_deref(), &result)?;
        Ok(result)
    }

    /// The test embeddings of `run` (a result of this runner's [`Runner::run`]) by the network
    /// of the epoch its validation selected, and that epoch: the members of an ensemble of the
    /// fold models of a cross-validation ([`crate::retrieval::ensemble`]). Only fold runs keep
    /// them ([`keeps_test_embeddings`]); an error names the run and the file when they are
    /// missing or unreadable.
    pub fn selected_test_embeddings(&self, run: &RunResult) -> Result<(u64, TestEmbeddings)> {
        let path = self.embeddings_path(&run.code, &run.recipe);
        if !path.is_file() {
            return Err(Error::file(
                &path,
                format!(
                    "run `{}` kept no test embeddings (only the fold runs of a \
                     cross-validation, `[validation] fold`, keep them)",
                    run.label
                ),
            ));
        }
        load_embeddings(&path)
    }

    /// The backbone weights a pretraining recipe ends with — the network every run of a scale
    /// starts from, as the papers fine-tune an ImageNet-pretrained backbone
    /// ([`super::ExperimentRecipe::pretraining`]): `spec` is trained once like any run (its
    /// result cached, so its curve can be read back), and its backbone written as safetensors
    /// with the names [`crate::models::pretrained::load_backbone`] reads, to
    /// `<cache>/backbones/<key>.safetensors` (without a cache, the system's temporary folder).
    /// The next call with the same recipe and one of the codes read ([`Runner::run_codes`], the
    /// first that has it) returns that file without training.
    pub fn pretrained_backbone(&self, spec: &RunSpec) -> Result<PathBuf> {
        let (config, recipe) = Self::keyed(spec)?;
        let dir = match &self.cache_dir {
            Some(d) => d.join("backbones"),
            None => std::env::temp_dir().join("rankwise-backbones"),
        };
        let weights_of = |code| dir.join(format!("{}.safetensors", Self::key_name(code, &recipe)));
        for code in self.run_codes() {
            let (weights, path) = (weights_of(code), self.result_path(code, &recipe));
            if weights.is_file() && self.cached(path.as_deref(), spec, &recipe, code)?.is_some() {
                return Ok(weights);
            }
        }
        let weights = weights_of(RUN_CODE);
        let path = self.result_path(RUN_CODE, &recipe);
        let (result, trainer) = self.train(spec, config, recipe.clone())?;
        let backbone: Vec<(String, candle_core::Tensor)> = trainer
            .params()
            .all()
            .into_iter()
            .filter_map(|(n, v)| {
                n.strip_prefix(crate::models::BACKBONE_PREFIX)
                    .map(|k| (k.to_string(), v.as_tensor().clone()))
            })
            .collect();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // The recipe rides along in the file's metadata: what trained these weights.
        crate::train::checkpoint::save(&weights, &backbone, &result.recipe)?;
        store(path.as_deref(), &result)?;
        Ok(weights)
    }

    /// The cached result at `path` of `code`'s run for `spec` (its own label), if any.
    fn cached(
        &self,
        path: Option<&Path>,
        spec: &RunSpec,
        recipe: &str,
        code: &str,
    ) -> Result<Option<RunResult>> {
        let Some(hit) = path
            .map(|p| read_cached(p, recipe, code))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        self.say(format_args!(
            "{}: cached ({:.0} s when run)",
            spec.label, hit.seconds
        ));
        Ok(Some(RunResult {
            label: spec.label.clone(),
            ..hit
        }))
    }

    /// Trains `config` (the recipe of `spec`, keyed `recipe`) to its end and collects what it
    /// measured; the trainer is returned for its weights.
    fn train(
        &self,
        spec: &RunSpec,
        config: TrainConfig,
        recipe: String,
    ) -> Result<(RunResult, Trainer<'static>)> {
        // The one place a run trains: a runner reading another code's runs never gets here.
        if !self.trains() {
            return Err(self.not_cached(&spec.label));
        }
        self.say(format_args!(
            "{}: training ({} epochs)…",
            spec.label, config.epochs
        ));
        let seed = config.seed;
        let start = Instant::now();
        let keeps = keeps_test_embeddings(&config);
        let mut trainer = Trainer::from_config(config)
            .map_err(|e| Error::invalid("run", format!("`{}`: {e}", spec.label)))?;
        if keeps {
            trainer
                .keep_selected_test_embeddings()
                .map_err(|e| Error::invalid("run", format!("`{}`: {e}", spec.label)))?;
        }
        let device = device_name(trainer.device());
        let report = trainer
            .fit()
            .map_err(|e| Error::invalid("run", format!("`{}`: {e}", spec.label)))?;
        let seconds = start.elapsed().as_secs_f64();
        // The experiments' recipes evaluate one test set (the embedded dataset's `test`, or
        // the first set of a real dataset's protocol).
        let eval = report
            .last_eval
            .as_ref()
            .and_then(|e| e.reports.first())
            .map(|(_, r)| r)
            .ok_or_else(|| {
                Error::invalid("run", format!("`{}` was never evaluated", spec.label))
            })?;
        let result = RunResult {
            label: spec.label.clone(),
            recipe,
            metrics: eval
                .rows
                .iter()
                .map(|r| MetricValue {
                    metric: r.metric.clone(),
                    level: r.level,
                    value: r.value,
                })
                .collect(),
            log: report.log.rows().to_vec(),
            seconds,
            test_queries: eval.num_queries,
            seed,
            device,
            code: RUN_CODE.to_string(),
        };
        let r1 = result.metric("R@1", Some(0)).unwrap_or(f64::NAN);
        self.say(format_args!(
            "{}: done in {seconds:.0} s, R@1 {r1:.4}",
            spec.label
        ));
        Ok((result, trainer))
    }

    /// Runs every spec, in order.
    pub fn run_all(&self, specs: &[RunSpec]) -> Result<Vec<RunResult>> {
        specs.iter().map(|s| self.run(s)).collect()
    }

    /// Runs every spec with up to `jobs` runs training side by side, and returns the results in
    /// the order of `specs`. Specs with the same recipe train once (each result keeps its own
    /// spec's label).
    ///
    /// Why side by side: a run of the small CNN keeps about one of the two cores of the CPU
    /// machine busy (measured: 82% of one core over the first six minutes of the `quick`
    /// reproduction), so two runs at once nearly double the throughput. A run's result does
    /// not depend on what runs beside it: every random draw is seeded by the recipe, and the
    /// parallel kernels write each chunk's result to its own place whichever thread computes
    /// it (the test `runs_side_by_side_equal_runs_alone` checks it bit for bit).
    ///
    /// Each of the runs side by side gets a rayon pool of its own with its share of the global
    /// pool's threads (one each with two runs on two cores), instead of all of them handing
    /// their parallel work to the one global pool: there, the two run threads and the two pool
    /// workers (four threads on two cores) woke, waited for and preempted each other at every
    /// parallel op of every step (5–6 % of the samples were in the scheduler and futexes). On the
    /// 2-core AMD EPYC VM, `rankwise reproduce --scale quick fastap` with empty caches took
    /// 69.8 / 78.7 s against 92.4 / 97.8 s with the shared pool (alternating; all 18 runs'
    /// logged metrics identical). Results do not depend on the pool's size (the kernels split
    /// the work into fixed parts; the test above also runs a recipe on pools of 1 and 3 threads).
    ///
    /// On an error, no new run starts and the first failing spec's error (in spec order) is
    /// returned once the runs under way have finished.
    pub fn run_many(&self, specs: &[RunSpec], jobs: usize) -> Result<Vec<RunResult>> {
        // One training per distinct recipe, in first-seen order.
        let mut unique: Vec<(String, usize)> = Vec::new();
        let mut which = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let (_, recipe) = Self::keyed(spec)?;
            match unique.iter().position(|(r, _)| *r == recipe) {
                Some(u) => which.push(u),
                None => {
                    which.push(unique.len());
                    unique.push((recipe, i));
                }
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let results: Vec<std::sync::Mutex<Option<Result<RunResult>>>> =
            unique.iter().map(|_| std::sync::Mutex::new(None)).collect();
        let jobs = jobs.clamp(1, unique.len().max(1));
        let threads_per_run = (rayon::current_num_threads() / jobs).max(1);
        let worker_loop = || loop {
            use std::sync::atomic::Ordering;
            if failed.load(Ordering::Relaxed) {
                return;
            }
            let u = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(_, i)) = unique.get(u) else {
                return;
            };
            let r = self.run(&specs[i]);
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            *results[u].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        };
        // Each side-by-side run on a pool of its own share of the threads (see the docs); alone,
        // a run keeps the whole pool. A pool that cannot be made leaves the run on the shared one.
        let worker = || {
            if jobs > 1 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads_per_run)
                    .thread_name(|i| format!("rankwise-run-{i}"))
                    .build();
                if let Ok(pool) = pool {
                    return pool.install(worker_loop);
                }
            }
            worker_loop()
        };
        std::thread::scope(|scope| {
            for _ in 1..jobs {
                scope.spawn(worker);
            }
            worker();
        });
        let results: Vec<Option<Result<RunResult>>> = results
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect();
        // The first error in spec order, else every result.
        let mut out = Vec::with_capacity(specs.len());
        for (spec, &u) in specs.iter().zip(&which) {
            match &results[u] {
                Some(Ok(r)) => out.push(RunResult {
                    label: spec.label.clone(),
                    ..r.clone()
                }),
                Some(Err(e)) => return Err(Error::invalid("run", e.to_string())),
                None => {
                    // Not started because an earlier-started run failed: report that one.
                    if let Some(Err(e)) = results.iter().flatten().find(|r| r.is_err()) {
                        return Err(Error::invalid("run", e.to_string()));
                    }
                    return Err(Error::invalid("run", format!("`{}` never ran", spec.label)));
                }
            }
        }
        Ok(out)
    }
}

/// `cpu`, or `cuda:<ordinal>` for a GPU (the device a run really used, whatever the recipe
/// asked: `auto` falls back to the CPU).
fn device_name(device: &candle_core::Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// A cached result whose recipe is `recipe` and run code `code`, if the file exists. A hash
/// collision (another recipe stored under the same name) counts as a miss; an unreadable file
/// is an error naming it.
fn read_cached(path: &Path, recipe: &str, code: &str) -> Result<Option<RunResult>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let cached: RunResult = serde_json::from_str(&text).map_err(|e| {
        Error::file(
            path,
            format!("not a cached run ({e}); delete the file to re-run"),
        )
    })?;
    Ok((cached.recipe == recipe && cached.code == code).then_some(cached))
}

/// The file extension of a run's kept test embeddings, after its key name.
const EMBEDDINGS_SUFFIX: &str = "test-embeddings.safetensors";

/// The format written into the metadata of a kept test embeddings file.
const EMBEDDINGS_FORMAT: &str = "rankwise selected test embeddings 1";

/// The JSON document of a kept test embeddings file.
#[derive(Serialize, Deserialize)]
struct EmbeddingsMeta {
    format: String,
    /// The run whose network embedded them (its label when trained).
    run: String,
    /// The epoch its validation selected.
    epoch: u64,
}

/// Whether a run of `config` keeps its selected epoch's test embeddings: a fold run of a
/// cross-validation (`[validation] fold`), whose models an ensemble concatenates
/// ([`crate::experiments::tune`]). Other runs keep none: their results are all a table reads,
/// and a test set's embeddings weigh far more (3,840 × 512 floats, 7.9 MB, on the embedded
/// dataset; 121 MB on SOP).
pub fn keeps_test_embeddings(config: &TrainConfig) -> bool {
    config.validation.as_ref().is_some_and(|v| v.fold.is_some())
}

/// Writes `kept` (embedded at `epoch` by the run labelled `run`) to `path` atomically, with
/// checksums ([`crate::train::checkpoint::save`]), making its folder.
fn save_embeddings(path: &Path, kept: &TestEmbeddings, epoch: u64, run: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let labels = |l: &Labels| {
        Tensor::from_vec(
            l.as_flat().to_vec(),
            (l.len(), l.num_levels()),
            &candle_core::Device::Cpu,
        )
    };
    let mut tensors = vec![
        ("queries".to_string(), kept.queries.clone()),
        ("query_labels".to_string(), labels(&kept.query_labels)?),
    ];
    if let Some((g, l)) = &kept.gallery {
        tensors.push(("gallery".to_string(), g.clone()));
        tensors.push(("gallery_labels".to_string(), labels(l)?));
    }
    let meta = EmbeddingsMeta {
        format: EMBEDDINGS_FORMAT.into(),
        run: run.into(),
        epoch,
    };
    let json = serde_json::to_string(&meta)
        .map_err(|e| Error::file(path, format!("cannot encode the metadata: {e}")))?;
    crate::train::checkpoint::save(path, &tensors, &json)
}

/// Reads a file of [`save_embeddings`]: the embeddings and their epoch. Errors name the file.
fn load_embeddings(path: &Path) -> Result<(u64, TestEmbeddings)> {
    let (mut tensors, json) = crate::train::checkpoint::load(path, &candle_core::Device::Cpu)?;
    let meta: EmbeddingsMeta = serde_json::from_str(&json)
        .ok()
        .filter(|m: &EmbeddingsMeta| m.format == EMBEDDINGS_FORMAT)
        .ok_or_else(|| {
            Error::file(
                path,
                format!("not a file of {EMBEDDINGS_FORMAT:?}: delete it to re-run"),
            )
        })?;
    let mut take = |name: &str| {
        tensors
            .remove(name)
            .ok_or_else(|| Error::file(path, format!("no tensor `{name}`")))
    };
    let labels = |t: Tensor| -> Result<Labels> {
        let (n, levels) = t.dims2()?;
        Labels::from_flat(n, levels, t.flatten_all()?.to_vec1::<i64>()?)
            .map_err(|e| Error::file(path, e.to_string()))
    };
    let queries = take("queries")?;
    let query_labels = labels(take("query_labels")?)?;
    let gallery = match take("gallery") {
        Ok(g) => Some((g, labels(take("gallery_labels")?)?)),
        Err(_) => None,
    };
    Ok((
        meta.epoch,
        TestEmbeddings {
            queries,
            query_labels,
            gallery,
        },
    ))
}

/// Writes `result` to `path` (if any) atomically, making its folder.
fn store(path: Option<&Path>, result: &RunResult) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let json = serde_json::to_string(result)
        .map_err(|e| Error::file(path, format!("cannot serialise the run: {e}")))?;
    write_atomically(path, |w| w.write_all(json.as_bytes()))
}

/// What a pretrained-weights file stands for in a run's cache key: its bytes' hash and length
/// (`weights fnv1a 0123456789abcdef, 412345 bytes`), whatever folder holds it.
fn content_key(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(format!(
        "weights fnv1a {:016x}, {} bytes",
        fnv1a(&bytes),
        bytes.len()
    ))
}

/// 64-bit FNV-1a: a stable file name for a recipe (std's hasher may change between releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How many runs [`Runner::run_many`] trains side by side by default: the `RANKWISE_JOBS`
/// environment variable if set, else the number of CPUs (at most 4: the runs also share the
/// memory bandwidth and rayon's pool). An error names the variable if it is not a positive
/// integer.
pub fn default_jobs() -> Result<usize> {
    match std::env::var("RANKWISE_JOBS") {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(Error::invalid(
                "RANKWISE_JOBS",
                format!("expected a positive integer, got {v:?}"),
            )),
        },
        _ => Ok(std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_test_embeddings_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = candle_core::Device::Cpu;
        let labels = Labels::new(vec![vec![0, 10], vec![1, 10], vec![2, 11]]).unwrap();
        let gallery_labels = Labels::new(vec![vec![0, 10], vec![2, 11]]).unwrap();
        let kept = TestEmbeddings {
            queries: Tensor::new(&[[0.5f32, -1.0], [2.0, 0.25], [1e-8, 3.0]], &cpu).unwrap(),
            query_labels: labels.clone(),
            gallery: Some((
                Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &cpu).unwrap(),
                gallery_labels.clone(),
            )),
        };
        let path = dir.path().join("sub").join("k.test-embeddings.safetensors");
        save_embeddings(&path, &kept, 7, "a run").unwrap();
        let (epoch, back) = load_embeddings(&path).unwrap();
        assert_eq!(epoch, 7);
        assert_eq!(
            back.queries.to_vec2::<f32>().unwrap(),
            kept.queries.to_vec2::<f32>().unwrap()
        );
        assert_eq!(back.query_labels, labels);
        let (g, gl) = back.gallery.unwrap();
        assert_eq!(g.to_vec2::<f32>().unwrap(), [[1.0, 2.0], [3.0, 4.0]]);
        assert_eq!(gl, gallery_labels);
        // Without a gallery, none comes back; a checkpoint of another kind is refused by name.
        let alone = TestEmbeddings {
            gallery: None,
            ..kept
        };
        save_embeddings(&path, &alone, 2, "b").unwrap();
        assert!(load_embeddings(&path).unwrap().1.gallery.is_none());
        let other = dir.path().join("other.safetensors");
        crate::train::checkpoint::save(&other, &[], "{\"format\":\"x\"}").unwrap();
        let e = load_embeddings(&other).unwrap_err().to_string();
        assert!(
            e.contains("other.safetensors") && e.contains("delete it"),
            "{e}"
        );
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_runner_reads_back_the_runs_of_another_code_and_trains_none() {
        let dir = tempfile::tempdir().unwrap();
        let spec = RunSpec {
            label: "row".into(),
            config: TrainConfig::default(),
        };
        let this_build = Runner::new(Some(dir.path().to_path_buf()), false);
        let old = "00000000000000aa";
        let reading = this_build.clone().reading_runs_of(old).unwrap();
        assert!(!reading.trains() && reading.run_code() == old);
        // A run that the old code left in the cache, under its key (not this build's).
        let (_, recipe) = Runner::keyed(&spec).unwrap();
        let path = reading.result_path(old, &recipe).unwrap();
        assert_ne!(
            Some(&path),
            this_build.result_path(RUN_CODE, &recipe).as_ref()
        );
        let stored = RunResult {
            label: "as trained".into(),
            recipe: recipe.clone(),
            metrics: vec![MetricValue {
                metric: "R@1".into(),
                level: Some(0),
                value: 0.25,
            }],
            log: Vec::new(),
            seconds: 1.0,
            test_queries: 4,
            seed: 0,
            device: "cpu".into(),
            code: old.into(),
        };
        store(Some(&path), &stored).unwrap();
        let read = reading.run(&spec).unwrap();
        assert_eq!(read.metric("R@1", Some(0)).unwrap(), 0.25);
        assert_eq!((read.label.as_str(), read.code.as_str()), ("row", old));
        assert_eq!(
            reading.run_many(std::slice::from_ref(&spec), 2).unwrap()[0],
            read
        );
        // Another code's runs are absent: an error naming it and saying nothing trains.
        let other = this_build
            .clone()
            .reading_runs_of("00000000000000BB")
            .unwrap();
        for e in [
            other.run(&spec).unwrap_err().to_string(),
            other.pretrained_backbone(&spec).unwrap_err().to_string(),
        ] {
            assert!(
                e.contains("00000000000000bb") && e.contains("never trained") && e.contains("row"),
                "{e}"
            );
        }
        // A fold run of the old code is read back only with its test embeddings beside it.
        let fold = RunSpec {
            label: "fold".into(),
            config: TrainConfig {
                validation: Some(ValidationConfig {
                    folds: Some(2),
                    fold: Some(0),
                    ..ValidationConfig::default()
                }),
                ..TrainConfig::default()
            },
        };
        assert!(keeps_test_embeddings(&fold.config) && !keeps_test_embeddings(&spec.config));
        let (_, fold_recipe) = Runner::keyed(&fold).unwrap();
        let fold_result = RunResult {
            recipe: fold_recipe.clone(),
            ..stored.clone()
        };
        store(
            reading.result_path(old, &fold_recipe).as_deref(),
            &fold_result,
        )
        .unwrap();
        let e = reading.run(&fold).unwrap_err().to_string();
        assert!(
            e.contains("test-embeddings.safetensors") && e.contains("no test embeddings"),
            "{e}"
        );
        let kept = TestEmbeddings {
            queries: Tensor::new(&[[1f32, 0.0], [0.0, 1.0]], &candle_core::Device::Cpu).unwrap(),
            query_labels: Labels::from_fine(&[0, 1]).unwrap(),
            gallery: None,
        };
        save_embeddings(
            &reading.embeddings_path(old, &fold_recipe),
            &kept,
            3,
            "fold",
        )
        .unwrap();
        let read = reading.run(&fold).unwrap();
        let (epoch, back) = reading.selected_test_embeddings(&read).unwrap();
        assert_eq!((epoch, back.query_labels), (3, kept.query_labels));
        // A run that keeps none says so, naming the run.
        let e = reading
            .selected_test_embeddings(&stored)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("as trained") && e.contains("kept no test embeddings"),
            "{e}"
        );
        // A file of the old code under the key of another (hash collision or a renamed file)
        // is not its run.
        let mut forged = stored.clone();
        forged.code = "00000000000000bb".into();
        let bb = "00000000000000bb";
        store(Some(&other.result_path(bb, &recipe).unwrap()), &stored).unwrap();
        assert!(other.run(&spec).is_err());
        store(Some(&other.result_path(bb, &recipe).unwrap()), &forged).unwrap();
        assert!(other.run(&spec).is_ok());
        // This build's code is the ordinary runner; bad codes and a runner without a cache are
        // errors naming what is wrong.
        assert!(this_build
            .clone()
            .reading_runs_of(RUN_CODE)
            .unwrap()
            .trains());
        for bad in ["00aa", "zz000000000000aa", ""] {
            let e = this_build
                .clone()
                .reading_runs_of(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("16 hex digits"), "{e}");
        }
        let e = Runner::new(None, false)
            .reading_runs_of(old)
            .unwrap_err()
            .to_string();
        assert!(e.contains("run cache"), "{e}");
    }

    #[test]
    fn a_runner_reads_several_codes_in_order_and_trains_only_what_none_has() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |label: &str, seed: u64| RunSpec {
            label: label.into(),
            config: TrainConfig {
                seed,
                ..TrainConfig::default()
            },
        };
        let (old, newer) = ("00000000000000aa", "00000000000000cc");
        let this_build = Runner::new(Some(dir.path().to_path_buf()), false);
        let result = |code: &str, recipe: &str, r1: f64| RunResult {
            label: "as trained".into(),
            recipe: recipe.into(),
            metrics: vec![MetricValue {
                metric: "R@1".into(),
                level: Some(0),
                value: r1,
            }],
            log: Vec::new(),
            seconds: 1.0,
            test_queries: 4,
            seed: 0,
            device: "cpu".into(),
            code: code.into(),
        };
        // Run `a` trained by both codes, run `b` by the newer only.
        let (_, a) = Runner::keyed(&spec("a", 0)).unwrap();
        let (_, b) = Runner::keyed(&spec("b", 1)).unwrap();
        for (code, recipe, r1) in [(old, &a, 0.1), (newer, &a, 0.2), (newer, &b, 0.3)] {
            let path = this_build.result_path(code, recipe).unwrap();
            store(Some(&path), &result(code, recipe, r1)).unwrap();
        }
        let both = this_build
            .clone()
            .reading_runs_of(old)
            .unwrap()
            .reading_runs_of(newer)
            .unwrap()
            .reading_runs_of(old)
            .unwrap();
        assert_eq!(both.run_codes(), [old, newer]);
        assert_eq!(both.run_code(), format!("{old}+{newer}"));
        assert!(!both.trains() && !both.reads_this_build_only());
        // The first code named that has the run: `a` from the old code, `b` from the newer.
        let read = both.run_many(&[spec("a", 0), spec("b", 1)], 2).unwrap();
        let got: Vec<(&str, f64)> = read
            .iter()
            .map(|r| (r.code.as_str(), r.metric("R@1", Some(0)).unwrap()))
            .collect();
        assert_eq!(got, [(old, 0.1), (newer, 0.3)]);
        let reversed = this_build
            .clone()
            .reading_runs_of(newer)
            .unwrap()
            .reading_runs_of(old)
            .unwrap();
        assert_eq!(reversed.run(&spec("a", 0)).unwrap().code, newer);
        // A run none of them has: an error naming every code, nothing trained.
        let e = both.run(&spec("c", 2)).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{old} or {newer}")) && e.contains("never trained"),
            "{e}"
        );
        // With this build's code among them the runner trains, but only what none has: the
        // cached runs come back without training (a default recipe could not train here).
        let with_this = both.clone().reading_runs_of(RUN_CODE).unwrap();
        assert!(with_this.trains() && !with_this.reads_this_build_only());
        assert_eq!(with_this.run(&spec("b", 1)).unwrap().code, newer);
        assert!(this_build
            .clone()
            .reading_runs_of(RUN_CODE)
            .unwrap()
            .reads_this_build_only());
    }
}

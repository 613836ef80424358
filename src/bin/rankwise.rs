//! `rankwise`: train embedding networks, embed images, evaluate retrieval embeddings and
//! reproduce the papers' tables from the command line.
//!
//! ```text
//! rankwise train --config configs/embedded_smooth_ap.toml --out runs/sap --set epochs=3
//! rankwise embed --config configs/embedded_smooth_ap.toml --checkpoint runs/sap/checkpoint.safetensors \
//!                --split test --out emb.npy --labels-out labels.csv
//! rankwise eval --embeddings emb.npy --labels labels.csv --recall-at 1,2,4,8
//! rankwise reproduce --scale quick smooth_ap
//! rankwise eval --example                        # a synthetic SOP-like set, in memory
//! rankwise gen-embeddings --preset small --out-dir demo
//! rankwise synth-data --config configs/paper/happier_sop.toml --root /tmp/synthetic/sop
//! rankwise train --config configs/paper/happier_sop.toml --set dataset.root=/tmp/synthetic/sop \
//!                --set pretrained= --set epochs=1 --out runs/smoke
//! rankwise eval --embeddings demo/embeddings.npy --labels demo/labels.csv --out results.json
//! rankwise eval --queries q.npy --references r.npy \
//!               --query-labels q.csv --reference-labels r.csv
//! rankwise fewshot --features novel.npy --labels novel.csv --shots 1,5 \
//!                  --classifier prototype --classifier k-reciprocal:grid
//! ```
//!
//! The binary only parses arguments, calls the library and prints; every computation is a library
//! function. Errors print as `error: …` with their causes, and exit with status 1.

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use clap::{Args, Parser, Subcommand, ValueEnum};
use rankwise::data::synthetic_on_disk::{
    remove_synthetic, write_dataset, OnDiskSpec, SyntheticKind,
};
use rankwise::experiments::compare::{
    write_comparison, Arm, ArmSpec, Finding, MetricChoice, Reading, SeedComparison,
};
use rankwise::experiments::tune::{
    metric_label, write_tuning, GridAxis, Search, SearchRange, Tuning,
};
use rankwise::experiments::{self, ReproduceDirs, Runner, Scale};
use rankwise::io::fewshot_results::{
    write_episode_accuracies, write_fewshot_results, EpisodeAccuracy, EpisodeVersus, FewShotRow,
    FewShotTable,
};
use rankwise::io::{
    check_compatible_sets, check_output_file, write_labels_csv, write_npy, write_results,
    LabelledEmbeddings, ResultFormat, ResultRow, ResultTable, Versus,
};
use rankwise::rerank::episode_method::compare_methods;
use rankwise::rerank::{EpisodeMethod, RerankMethod};
use rankwise::retrieval::{
    evaluate, paired_differences, EvalOptions, EvalReport, PairedDifference, SelfMatch, Similarity,
};
use rankwise::samplers::episodes::EpisodeConfig;
use rankwise::stats::format_p;
use rankwise::synthetic_embeddings::{Preset, SyntheticSpec};
use rankwise::train::{
    check_recipe, load_with_overrides, overrides::blame, train_to_dir, DeviceChoice, Reuse,
    RunOptions, TrainConfig, Trainer, RESULTS_FILE,
};
use rankwise::Relevance;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

// Keeps the large tensor buffers of a training step for the next step once `tune_allocator` has
// run (train, embed, reproduce): rankwise::cpu::alloc explains why.
#[global_allocator]
static ALLOCATOR: rankwise::cpu::alloc::LargeBlockCache = rankwise::cpu::alloc::LargeBlockCache;

#[derive(Parser, Debug)]
#[command(
    name = "rankwise",
    // The run code too: run-cache entries made by another build (another machine, a device)
    // are reused only where it matches (rankwise::experiments::RUN_CODE).
    version = concat!(env!("CARGO_PKG_VERSION"), " (run code ", env!("RANKWISE_RUN_CODE"), ")"),
    about = "Rank-based learning for image retrieval: train embedding networks (Smooth-AP, \
             FastAP, RaMBO, HAPPIER, …), embed images, and compute exact retrieval metrics \
             (mAP, mAP@R, R@k, H-AP, ASI, NDCG) for embeddings with hierarchical labels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Rank every query against the references and report the metrics.
    #[command(after_help = EVAL_EXAMPLES)]
    Eval(Box<EvalArgs>),
    /// Few-shot classification on frozen features (SSR Table 2's protocol): N-way K-shot
    /// episodes, every classifier on the same episodes, accuracy ± 95% interval and each
    /// classifier against the first, episode by episode.
    #[command(after_help = FEWSHOT_EXAMPLES)]
    Fewshot(FewshotArgs),
    /// Write a synthetic SOP-shaped set (embeddings.npy + labels.csv) to show the file formats.
    #[command(after_help = GEN_EXAMPLES)]
    GenEmbeddings(GenArgs),
    /// Train an embedding network from a TOML recipe into a run folder (config.toml,
    /// metrics.csv/.parquet, checkpoint.safetensors, results.json).
    #[command(after_help = TRAIN_EXAMPLES)]
    Train(TrainArgs),
    /// Train variants of a recipe ("arms") with the same seeds and test each metric's
    /// difference to the first arm seed by seed (paired t-test, Holm-corrected): whether a
    /// change beats the training's seed-to-seed noise.
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(CompareArgs),
    /// Search a grid of recipe overrides on classes held out of training ([validation]), never
    /// on the test classes: every point trained with the same seeds, the best mean validation
    /// value chosen, its test metrics reported, beside how sure the choice is and what choosing
    /// on the test set would have reported.
    #[command(after_help = TUNE_EXAMPLES)]
    Tune(TuneArgs),
    /// Embed the images of one split with a trained checkpoint (.npy + labels .csv, the files
    /// `rankwise eval` reads).
    #[command(after_help = EMBED_EXAMPLES)]
    Embed(EmbedArgs),
    /// Regenerate the papers' tables and figures (Smooth-AP, FastAP, RaMBO, HAPPIER, SSR) at a
    /// scale.
    #[command(after_help = REPRODUCE_EXAMPLES)]
    Reproduce(ReproduceArgs),
    /// Write a synthetic dataset in a real dataset's on-disk format (JPEG images, list files,
    /// folder names), sized so that a recipe's sampler forms full batches: runs a paper recipe
    /// end to end without its data (train with --set dataset.root=<root>).
    #[command(after_help = SYNTH_EXAMPLES)]
    SynthData(SynthDataArgs),
}

const TUNE_EXAMPLES: &str = "\
Examples:
  rankwise tune --config configs/embedded_smooth_ap.toml --set validation.fraction=0.2 \\
                --grid loss.tau=0.001,0.01,0.1 --seeds 3
  rankwise tune --config configs/embedded_smooth_ap.toml --set validation.fraction=0.2 \\
                --grid loss.tau=0.01,0.1 --grid optimizer.backbone.lr=1e-4,5e-4 \\
                --seeds 4 --set epochs=12 --metric all --out tune.json
  rankwise tune --config configs/embedded_smooth_ap.toml --set validation.folds=4 \\
                --grid loss.tau=0.01,0.1 --seeds 3   # class-disjoint 4-fold cross-validation
  rankwise tune --config configs/embedded_smooth_ap.toml --set validation.fraction=0.2 \\
                --sample 'loss.tau=loguniform(0.01,1)' --samples 6 --seeds 3   # random points

Every point trains with seeds FIRST..FIRST+N-1 and holds the same [validation] classes out of
training; each run is read at the epoch its validation selected, and the point with the best
mean validation value is chosen (the first on a tie). Its test metrics are the result to report.
Each other point is compared with it on validation seed by seed (paired t-test, Holm-corrected):
those inside the noise could as well have been chosen. The point with the best test value is
shown too, with the optimism a choice on the test classes would have added. With
validation.folds=K (no validation.fold) every point trains once per fold and seed, each fold
holding another K-th of the classes out, and each seed's values are the mean over its folds (the
separated result); the fold models are also evaluated as one, their selected epochs' test
embeddings concatenated (the concatenated result), and its gain over the separated mean is
tested over the seeds. Runs are kept in --cache by recipe and run code, shared with rankwise
compare (fold runs with their test embeddings).

In place of a grid, --sample KEY=DIST (loguniform, uniform, int or choice) with --samples N
draws N random points (Bergstra & Bengio: N values of every key, where a grid tries N^(1/D)),
each value rounded to three significant digits. Point i is drawn from its own stream of
--sample-seed, so more samples with the same seed keep the first points and train only the new
ones. The reading says when the chosen value of a key is the lowest or highest searched.";

const TRAIN_EXAMPLES: &str = "\
Examples:
  rankwise train --config configs/embedded_smooth_ap.toml --out runs/sap
  rankwise train --config configs/embedded_smooth_ap.toml --out runs/sap --set epochs=3 \\
                 --set loss.tau=0.05 --set optimizer.backbone.lr=1e-4
  rankwise train --config configs/embedded_smooth_ap.toml --out runs/sap --resume --set epochs=8
  rankwise train --config configs/embedded_smooth_ap.toml --out runs/sap --overwrite 2> train.log
  rankwise train --config configs/embedded_smooth_ap.toml --out runs/sap_val \\
                 --set validation.fraction=0.2  # select the epoch on held-out training classes

A run folder holds one run: training into a folder that holds one needs --resume (continue it) or
--overwrite (replace it), and a second process writing the same folder is refused. A line per
epoch (loss, R@1, images/s, ETA) goes to stderr, on a terminal or not; -q silences it.";

const COMPARE_EXAMPLES: &str = "\
Examples:
  rankwise compare --config configs/embedded_smooth_ap.toml --seeds 5 \\
                   --arm 'tau 0.01' --arm 'tau 0.1: loss.tau=0.1'
  rankwise compare --config configs/embedded_smooth_ap.toml --seeds 8 --set epochs=8 \\
                   --arm smooth-ap --arm 'fastap: loss.kind=fast_ap' \\
                   --metric R@1 --metric mAP@R --metric H-AP --out compare.json
  rankwise compare ... --seeds 8 --looks 4       # read at 4 seeds before: Pocock's level
  rankwise compare ... --set validation.fraction=0.2 --at selected
                                                 # each run at its validation-selected epoch

Every arm trains with seeds FIRST..FIRST+N-1 (the recipe's own seed is replaced), so arm and
baseline share each seed's initial weights and batches, and each difference is tested seed by
seed (two-sided paired t-test, n - 1 degrees of freedom) at 5%, Holm-corrected over the table's
comparisons. Runs are kept in --cache by recipe and run code: more seeds or arms later train only
the new runs; give --looks the seed counts at which you read the comparison before, so that
adding seeds until a gap turns significant is not a way to find effects by chance.";

const EMBED_EXAMPLES: &str = "\
Examples:
  rankwise embed --config configs/embedded_smooth_ap.toml --checkpoint runs/sap/checkpoint.safetensors \\
                 --split test --out emb.npy --labels-out labels.csv
  rankwise eval --embeddings emb.npy --labels labels.csv --recall-at 1,2,4,8

Pass the same --set overrides as to `rankwise train` (the model must match the checkpoint).";

const EVAL_EXAMPLES: &str = "\
Examples:
  rankwise eval --example
  rankwise eval --embeddings emb.npy --labels labels.csv --recall-at 1,2,4,8 --out results.json
  rankwise eval --queries q.npy --references r.npy --query-labels q.csv --reference-labels r.csv
  rankwise eval --embeddings emb.npy --labels labels.csv --relevance wap --wap-weights 0.5,1
  rankwise eval --example --recall-at 1,2,4,8 --rerank k-reciprocal:20,6,0.3
  rankwise eval --embeddings a.npy --labels labels.csv --versus b.npy   # paired test over the queries
  rankwise eval --embeddings a.npy --labels labels.csv --concat b.npy --versus a.npy
                                       # models a and b as one (concatenated), against a alone
  rankwise eval --queries q.npy --references r.npy --query-labels q.csv --reference-labels r.csv \\
                --concat-queries bq.npy --concat-references br.npy   # the same, separate sets";

const FEWSHOT_EXAMPLES: &str = "\
Examples:
  rankwise fewshot --features novel.npy --labels novel.csv
  rankwise fewshot --features novel.npy --labels novel.csv --shots 1,5 --episodes 2000 \\
                   --classifier prototype --classifier soft-kmeans --classifier k-reciprocal:grid
  rankwise fewshot --features novel.npy --labels novel.csv --shots 1 \\
                   --classifier prototype --classifier ssr:ssr_5way1shot.safetensors --out fs.json

Classifiers: prototype (cosine, SSR Table 2's Baseline), protonet (squared Euclidean),
soft-kmeans[:STEPS,SCALE], k-reciprocal[:K1,K2,LAMBDA], k-reciprocal:grid (the best of SSR's 27
points chosen on the test episodes themselves, as SSR's script reports it: optimistic) and
ssr:PATH (a model saved by rankwise::rerank::ssr::SsrModel::save, meta-trained for these
episodes). Every classifier sees the same episodes, so each is compared with the first by the
paired t-test over the episodes; that covers the choice of episodes, not the training of the
features or of the SSR model.";

const GEN_EXAMPLES: &str = "\
Examples:
  rankwise gen-embeddings --preset small --out-dir demo
  rankwise eval --embeddings demo/embeddings.npy --labels demo/labels.csv";

const REPRODUCE_EXAMPLES: &str = "\
Examples:
  rankwise reproduce --scale quick                 # every paper, the embedded data, the CPU
  rankwise reproduce --scale quick smooth_ap ssr   # two papers
  rankwise reproduce --scale tiny rambo --tables-dir /tmp/t --figures-dir /tmp/f";

const SYNTH_EXAMPLES: &str = "\
Examples:
  rankwise synth-data --config configs/paper/happier_sop.toml --root /tmp/synthetic/sop
  rankwise train --config configs/paper/happier_sop.toml --set dataset.root=/tmp/synthetic/sop \\
                 --set pretrained= --set epochs=1 --out runs/smoke";

/// The help of `reproduce`'s papers: every key of the experiments' registry.
fn papers_help() -> String {
    format!(
        "Papers to reproduce (default: all): {}",
        experiments::keys().join(", ")
    )
}

#[derive(Args, Debug)]
struct SynthDataArgs {
    /// The recipe to serve: its `[dataset] kind` gives the format, its sampler the size.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "kind",
        conflicts_with = "kind"
    )]
    config: Option<PathBuf>,
    /// Override a key of the recipe (as for `rankwise train`): pass the same --set as to train,
    /// so that the size follows the sampler trained with. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "config")]
    set: Vec<String>,
    /// The format, without a recipe: sop, inshop, inat_base, inat_full, dyml_vehicle,
    /// dyml_animal, dyml_product, cub or vehicleid (default size: 16 + 16 classes of 4 images).
    #[arg(long, value_name = "KIND")]
    kind: Option<String>,
    /// The dataset root to create (a recipe's `dataset.root`); must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Batches per epoch of an m-per-class sampler (the other samplers' epochs have a fixed
    /// number of batches: batches_per_super_pair or batches_per_meta_pair per pair).
    #[arg(long, value_name = "N", default_value_t = 2)]
    batches: usize,
    /// Training classes (overrides the size derived from the recipe).
    #[arg(long, value_name = "N")]
    train_classes: Option<usize>,
    /// Images per training class.
    #[arg(long, value_name = "N")]
    images_per_class: Option<usize>,
    /// Test classes.
    #[arg(long, value_name = "N")]
    test_classes: Option<usize>,
    /// Images per test class (≥ 2).
    #[arg(long, value_name = "N")]
    test_images_per_class: Option<usize>,
    /// Super-classes (label level 1).
    #[arg(long, value_name = "N")]
    super_classes: Option<usize>,
    /// Image height in pixels (the recipes' pipelines resize and crop to 224).
    #[arg(long, value_name = "PX", default_value_t = 64)]
    image_size: u32,
    /// Seed of the colours and noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replace an earlier synthetic dataset at --root (only a folder holding
    /// rankwise_synthetic.json is ever removed).
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// The TOML recipe (see configs/; e.g. configs/embedded_smooth_ap.toml).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Override a key of the recipe: dotted TOML key = TOML value (a bare word is a string),
    /// e.g. --set epochs=3 --set optimizer.backbone.lr=1e-4 --set loss.tau=0.05. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Run folder (default: runs/<recipe name>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Continue the run in --out from its checkpoint.safetensors (same recipe; `epochs` may grow,
    /// not shrink).
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// Replace the run in --out (its config, metrics, checkpoint and results are removed once the
    /// new recipe has been checked).
    #[arg(long)]
    overwrite: bool,
    /// Device: cpu, cuda or auto (overrides the recipe's `device`).
    #[arg(long)]
    device: Option<String>,
    /// No progress (bars, per-epoch lines) and no information lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct CompareArgs {
    /// The recipe every arm starts from (TOML, as `rankwise train` reads it).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// An arm: LABEL, or LABEL: KEY=VALUE; KEY=VALUE (overrides of the recipe, as --set), the
    /// first item possibly @FILE (another recipe). Repeat for each arm, at least two; the first
    /// is the baseline every other arm is compared with.
    #[arg(long = "arm", value_name = "LABEL[: ITEMS]", value_parser = parse_lib::<ArmSpec>, required = true)]
    arms: Vec<ArmSpec>,
    /// Override a key of every arm's recipe (before the arm's own). Repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    set: Vec<String>,
    #[command(flatten)]
    runs: SeededRuns,
    /// A metric to compare: NAME (its finest level, e.g. R@1, mAP@R, H-AP), NAME:LEVEL, or all.
    /// Repeatable.
    #[arg(long = "metric", value_name = "NAME[:LEVEL]", value_parser = parse_lib::<MetricChoice>,
          default_values = ["R@1", "mAP@R"])]
    metrics: Vec<MetricChoice>,
    /// Seed counts at which these arms were compared before (increasing, below --seeds): each
    /// comparison is then held to Pocock's per-look level instead of 5%.
    #[arg(long, value_name = "N,…", value_delimiter = ',')]
    looks: Vec<usize>,
    /// Which evaluation of each run to compare: last (the test metrics after the last epoch) or
    /// selected (those of the epoch each run's held-out classes chose: every arm needs a
    /// [validation] table).
    #[arg(long, value_name = "last|selected", value_parser = parse_lib::<Reading>, default_value = "last")]
    at: Reading,
    /// Write the comparison (.json: recipes, every seed's value and the tests; .csv: a line per
    /// metric and arm), atomically.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// How `compare` and `tune` train their runs: the seeds, the cache, the jobs, the device.
#[derive(Args, Debug)]
struct SeededRuns {
    /// Seeds per arm or grid point (at least 2).
    #[arg(long, default_value_t = 3)]
    seeds: usize,
    /// The first seed: every recipe trains with seeds FIRST, FIRST + 1, ….
    #[arg(long, value_name = "FIRST", default_value_t = 0)]
    first_seed: u64,
    /// Run cache: every run kept by its recipe and the run code.
    #[arg(long, value_name = "DIR", default_value = "runs/cache")]
    cache: PathBuf,
    /// Keep no run (train every run, cache nothing).
    #[arg(long)]
    no_cache: bool,
    /// Runs trained side by side (default: $RANKWISE_JOBS, else the CPUs, at most 4).
    #[arg(long)]
    jobs: Option<usize>,
    /// Device: cpu, cuda or auto (overrides the recipes' `device`).
    #[arg(long)]
    device: Option<String>,
    /// Print the tables only (no line per run on stderr).
    #[arg(short, long)]
    quiet: bool,
}

impl SeededRuns {
    /// FIRST, FIRST + 1, … (`--seeds` of them).
    fn seed_list(&self) -> Result<Vec<u64>> {
        if self.seeds < 2 {
            bail!(
                "--seeds {}: a test over seeds needs at least two distinct seeds",
                self.seeds
            );
        }
        (0..self.seeds as u64)
            .map(|i| {
                self.first_seed
                    .checked_add(i)
                    .context("--first-seed: the seeds overflow u64")
            })
            .collect()
    }

    /// `--device` applied to a recipe, checked against this build.
    fn set_device(&self, arm: &mut Arm) -> Result<()> {
        if let Some(d) = &self.device {
            arm.config.device = DeviceChoice::parse(d).context("--device")?;
            arm.config
                .device
                .check_available()
                .with_context(|| format!("--device {d}"))?;
        }
        Ok(())
    }

    /// The runner (cached unless `--no-cache`) and the number of runs side by side, announced
    /// on stderr as `what` (e.g. `comparing 3 arms`) unless `--quiet`.
    fn runner(&self, what: &str, seeds: &[u64]) -> Result<(Runner, usize)> {
        let cache = (!self.no_cache).then(|| self.cache.clone());
        let runner = Runner::new(cache, !self.quiet).progress_on_stderr();
        let jobs = match self.jobs {
            Some(0) => bail!("--jobs: at least 1"),
            Some(j) => j,
            None => experiments::runs::default_jobs()?,
        };
        if !self.quiet {
            eprintln!(
                "{what} × {} seeds ({}–{}), up to {jobs} run(s) side by side, run cache {}",
                seeds.len(),
                seeds[0],
                seeds[seeds.len() - 1],
                if self.no_cache {
                    "off".to_string()
                } else {
                    self.cache.display().to_string()
                }
            );
        }
        Ok((runner, jobs))
    }
}

#[derive(Args, Debug)]
struct TuneArgs {
    /// The recipe every point starts from (TOML, as `rankwise train` reads it); it, or
    /// --set, must hold classes out with a [validation] table.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// An axis of the grid: a recipe key and its values, KEY=V1,V2,… (TOML values, as --set).
    /// Repeat for more axes: every combination is a point.
    #[arg(long = "grid", value_name = "KEY=V1,V2,…", value_parser = parse_lib::<GridAxis>,
          required_unless_present = "sample", conflicts_with = "sample")]
    grid: Vec<GridAxis>,
    /// A range of a random search: KEY=loguniform(LOW,HIGH) (scales: τ, learning rates),
    /// KEY=uniform(LOW,HIGH), KEY=int(LOW,HIGH) or KEY=choice(V1,V2,…). Repeat for more keys;
    /// every point draws each key's value (rounded to three significant digits).
    #[arg(long = "sample", value_name = "KEY=DIST(…)", value_parser = parse_lib::<SearchRange>,
          requires = "samples")]
    sample: Vec<SearchRange>,
    /// How many points a random search draws (--sample). With the same --sample-seed, the first
    /// points do not depend on it: more samples train only the new points.
    #[arg(long, value_name = "N", requires = "sample")]
    samples: Option<usize>,
    /// The seed of a random search's draws (not of the runs: every point trains with each of
    /// --seeds).
    #[arg(long, value_name = "SEED", default_value_t = 0, requires = "sample")]
    sample_seed: u64,
    /// Override a key of every point's recipe (e.g. validation.fraction=0.2, or
    /// validation.folds=4 to cross-validate: every point trains on each fold). Repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// A test metric to report for every point: NAME (its finest level), NAME:LEVEL, or all.
    /// The validation's metric is always reported. Repeatable.
    #[arg(long = "metric", value_name = "NAME[:LEVEL]", value_parser = parse_lib::<MetricChoice>,
          default_values = ["R@1", "mAP@R"])]
    metrics: Vec<MetricChoice>,
    #[command(flatten)]
    runs: SeededRuns,
    /// Write the search (.json: recipes, every seed's value and the tests; .csv: a line per
    /// point), atomically.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Draw the search along each numeric key (validation and test values with their 95%
    /// intervals, the chosen point marked) into DIR/tune_<key>.png and .svg.
    #[arg(long, value_name = "DIR")]
    figures: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct EmbedArgs {
    /// The recipe the checkpoint was trained with (its data and model; `--set` as for train).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Override a key of the recipe (as for `rankwise train`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The checkpoint (a run folder's checkpoint.safetensors).
    #[arg(long, value_name = "FILE")]
    checkpoint: PathBuf,
    /// Which images: train, test (a test set ranked against itself), query / gallery (a test
    /// set with a separate gallery, e.g. In-Shop), or val (the classes a recipe's
    /// `[validation]` table holds out of train).
    #[arg(long, value_enum)]
    split: SplitArg,
    /// Embeddings file to write (.npy, float32, one row per image), atomically.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Labels file to write (.csv with a header, finest level first), atomically.
    #[arg(long, value_name = "FILE")]
    labels_out: Option<PathBuf>,
    /// Device: cpu, cuda or auto (overrides the recipe's `device`).
    #[arg(long)]
    device: Option<String>,
    /// No progress bar and no information lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SplitArg {
    Train,
    Test,
    Query,
    Gallery,
    Val,
}

#[derive(Args, Debug)]
struct ReproduceArgs {
    /// tiny (seconds, numbers meaningless, written under target/reproduce-tiny/), quick (the
    /// embedded dataset on the CPU, minutes), standard (the quick data and network trained longer,
    /// fine-tuned from the backbone of the recipe's `[pretraining.standard]` where it has one,
    /// each recipe's `[seeds] standard` seeds, SSR with its replicates; tables under
    /// paper_tables/standard/) or paper (the papers' data and recipes; needs the data and a GPU).
    /// Default: $RANKWISE_SCALE, else quick. Runs side by side: $RANKWISE_JOBS, else the CPUs
    /// (at most 4).
    #[arg(long, value_name = "SCALE")]
    scale: Option<String>,
    #[arg(help = papers_help())]
    papers: Vec<String>,
    /// Folder for the tables (default: paper_tables/, or target/reproduce-tiny/paper_tables/ at
    /// the tiny scale).
    #[arg(long, value_name = "DIR")]
    tables_dir: Option<PathBuf>,
    /// Folder for the figures (default: figures/, or target/reproduce-tiny/figures/ at tiny).
    #[arg(long, value_name = "DIR")]
    figures_dir: Option<PathBuf>,
    /// Run cache (default: target/rankwise-runs/<scale>/).
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
    /// Read back the cached runs of this run code (16 hex digits, as `rankwise --version`
    /// prints it and the tables name it) instead of this build's, training none: re-reads the
    /// committed standard runs (`scripts/standard_runs.sh load`) after the training code has
    /// changed. A missing run is an error. Repeatable: each run is read from the first code
    /// named that has it (every row names its runs' codes); naming this build's code too trains
    /// what none of them has, and only that (the rows added since). SSR, whose replicates train
    /// inside its measurement, cannot be re-read this way.
    #[arg(long, value_name = "CODE")]
    runs_of: Vec<String>,
    /// The repository root holding configs/experiments/ and paper_tables/published/.
    #[arg(long, value_name = "DIR", default_value = ".")]
    root: PathBuf,
}

#[derive(Args, Debug)]
struct EvalArgs {
    /// Embeddings of one set ranked against itself (each item is a query, itself excluded):
    /// a 2-D .npy (float32/float64) or .safetensors file, one row per item.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["queries", "references"])]
    embeddings: Option<PathBuf>,
    /// Query embeddings, ranked against --references.
    #[arg(long, value_name = "FILE", requires = "references")]
    queries: Option<PathBuf>,
    /// Reference (gallery) embeddings.
    #[arg(long, value_name = "FILE", requires = "queries")]
    references: Option<PathBuf>,
    /// Labels of --embeddings: .csv with a header (one integer column per level, finest first)
    /// or .parquet (integer columns).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["query_labels", "reference_labels"])]
    labels: Option<PathBuf>,
    /// Labels of --queries.
    #[arg(long, value_name = "FILE", requires = "reference_labels")]
    query_labels: Option<PathBuf>,
    /// Labels of --references.
    #[arg(long, value_name = "FILE", requires = "query_labels")]
    reference_labels: Option<PathBuf>,
    /// Label columns to use, finest first (default: every column, in file order).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    label_columns: Vec<String>,
    /// Tensor to read from .safetensors files holding several (default: the only one, or
    /// 'embeddings').
    #[arg(long, value_name = "NAME")]
    tensor: Option<String>,
    /// The k of R@k (SOP: 1,10,100,1000; CUB/Cars: 1,2,4,8; iNat: 1,4,16,32).
    #[arg(
        long,
        value_name = "K,…",
        value_delimiter = ',',
        default_value = "1,10,100,1000"
    )]
    recall_at: Vec<usize>,
    /// Skip the hierarchical metrics (H-AP, ASI, NDCG): faster, binary metrics only.
    #[arg(long)]
    no_hierarchical: bool,
    /// Report the binary metrics (mAP, mAP@R, R@k, …) at the fine level only, not at every label
    /// level.
    #[arg(long)]
    fine_only: bool,
    /// Relevance of H-AP: pop (HAPPIER Eq. 4), wap (ΣwAP, HAPPIER supp. A.2, needs
    /// --wap-weights) or level (raw level weights, HAPPIER Fig. 3).
    #[arg(long, value_enum, default_value_t = RelevanceKind::Pop)]
    relevance: RelevanceKind,
    /// Exponent α of the pop and level relevances.
    #[arg(long, default_value_t = 1.0)]
    alpha: f64,
    /// pop relevance: count the query in the population of its own fine class, as the HAPPIER
    /// code that produced the published numbers does (default).
    #[arg(long, overrides_with = "no_count_query")]
    count_query: bool,
    /// pop relevance: do not count the query (the paper's Eq. 4).
    #[arg(long, overrides_with = "count_query")]
    no_count_query: bool,
    /// ΣwAP weights w_1..w_L, one per level, coarsest match first (w_L = same fine class).
    #[arg(long, value_name = "W,…", value_delimiter = ',')]
    wap_weights: Vec<f64>,
    /// How the query is kept out of its own ranking: auto (same-index for --embeddings, none for
    /// --queries/--references), none, same-index, or drop-first (pytorch-metric-learning's
    /// ref_includes_query: drop the top hit).
    #[arg(long, value_enum, default_value_t = SelfMatchArg::Auto)]
    self_match: SelfMatchArg,
    /// Score used to rank: cosine (the embeddings are L2-normalised first, as in every paper),
    /// inner-product (faiss IndexFlatIP) or euclidean (faiss IndexFlatL2).
    #[arg(long, value_enum, default_value_t = SimilarityArg::Cosine)]
    similarity: SimilarityArg,
    /// Compare with a second model's embeddings of the same items (same order, same labels):
    /// each metric of both, their difference, its 95% interval and the p-value of the paired
    /// t-test over the queries (the test queries' noise, not the training's).
    #[arg(long, value_name = "FILE", requires = "embeddings")]
    versus: Option<PathBuf>,
    /// Evaluate --embeddings and these other models' embeddings of the same items (same order)
    /// as one model: each L2-normalised, then concatenated item by item, so that the ensemble
    /// ranks by the mean of the models' cosine similarities (Musgrave et al.'s concatenated
    /// result). Repeat for more models; --versus then compares the ensemble with one model.
    #[arg(long, value_name = "FILE", requires = "embeddings")]
    concat: Vec<PathBuf>,
    /// With --queries/--references: another model's query embeddings, evaluated with the
    /// first as one (see --concat). Repeat for more models, each with its --concat-references,
    /// paired in the order given.
    #[arg(long, value_name = "FILE", requires_all = ["queries", "concat_references"])]
    concat_queries: Vec<PathBuf>,
    /// With --queries/--references: that model's reference embeddings (see --concat-queries).
    #[arg(long, value_name = "FILE", requires_all = ["references", "concat_queries"])]
    concat_references: Vec<PathBuf>,
    /// With --queries/--references: the second model's query embeddings (see --versus).
    #[arg(long, value_name = "FILE", requires_all = ["queries", "versus_references"])]
    versus_queries: Option<PathBuf>,
    /// With --queries/--references: the second model's reference embeddings (see --versus).
    #[arg(long, value_name = "FILE", requires_all = ["references", "versus_queries"])]
    versus_references: Option<PathBuf>,
    /// Re-rank before scoring (on the CPU, from cosine similarities, SSR Table 1's second
    /// stages): k-reciprocal[:K1,K2,LAMBDA] (Zhong et al. 2017; default 20,6,0.3), aqe:K,
    /// aqewd:K, alpha-qe:K[,ALPHA] (default α = 3) or dqe:K, K the neighbours expanding a
    /// query.
    #[arg(long, value_name = "METHOD", value_parser = parse_lib::<RerankMethod>)]
    rerank: Option<RerankMethod>,
    /// Queries ranked per chunk (memory: chunk × references scores); default: the engine's.
    #[arg(long, value_name = "N")]
    chunk_size: Option<usize>,
    /// Write the results to FILE: .json (rows and settings) or .csv (rows), atomically.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Evaluate a synthetic SOP-shaped set generated in memory (small: 600 items; sop: 60,502).
    #[arg(
        long,
        value_enum,
        value_name = "PRESET",
        num_args = 0..=1,
        default_missing_value = "small",
        conflicts_with_all = ["embeddings", "queries", "references", "labels", "query_labels", "reference_labels"]
    )]
    example: Option<PresetArg>,
    /// Seed of the --example set.
    #[arg(long, default_value_t = 0, requires = "example")]
    seed: u64,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// No progress bar and no information lines on stderr (the table is still printed).
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct FewshotArgs {
    /// Features of the items the episodes are drawn from (typically the novel classes' images):
    /// a 2-D .npy (float32/float64) or .safetensors file, one row per item.
    #[arg(long, value_name = "FILE")]
    features: PathBuf,
    /// Their labels: .csv with a header (one integer column per level, finest first) or
    /// .parquet (integer columns).
    #[arg(long, value_name = "FILE")]
    labels: PathBuf,
    /// Label columns to use, finest first (default: every column, in file order).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    label_columns: Vec<String>,
    /// Tensor to read from a .safetensors file holding several.
    #[arg(long, value_name = "NAME")]
    tensor: Option<String>,
    /// The label level whose classes the episodes draw (0 = the first column).
    #[arg(long, default_value_t = 0)]
    level: usize,
    /// N: classes per episode.
    #[arg(long, default_value_t = 5)]
    ways: usize,
    /// K: support items per class; each value is a table of its own episodes.
    #[arg(long, value_name = "K,…", value_delimiter = ',', default_value = "1,5")]
    shots: Vec<usize>,
    /// Query items per class.
    #[arg(long, default_value_t = 15)]
    queries: usize,
    /// Episodes per table (SSR: 2,000).
    #[arg(long, default_value_t = 2000)]
    episodes: usize,
    /// Seed of the episodes: the same seed draws the same episodes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A classifier (repeat the flag for several; the first is the one the others are compared
    /// with): prototype, protonet, soft-kmeans[:STEPS,SCALE], k-reciprocal[:K1,K2,LAMBDA],
    /// k-reciprocal:grid or ssr:PATH.
    #[arg(
        long = "classifier",
        value_name = "METHOD",
        value_parser = parse_lib::<EpisodeMethod>,
        default_value = "prototype"
    )]
    classifiers: Vec<EpisodeMethod>,
    /// Write the results (.json: the table with its settings; .csv: the rows), atomically.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Write every classifier's accuracy on every episode (.csv: ways, shots, episode,
    /// classifier, accuracy), atomically: another features file or another tool scored on the
    /// same episodes (same labels, --ways/--shots/--queries/--level and --seed) pairs with it.
    #[arg(long, value_name = "FILE")]
    per_episode: Option<PathBuf>,
    /// Print the table only (no progress on stderr).
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct GenArgs {
    /// Size of the set: small (600 items, D = 64) or sop (60,502 items, D = 512).
    #[arg(long, value_enum, default_value_t = PresetArg::Small)]
    preset: PresetArg,
    /// Folder to write embeddings.npy and labels.csv into (created if needed).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Seed of the generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum RelevanceKind {
    Pop,
    Wap,
    Level,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SelfMatchArg {
    Auto,
    None,
    SameIndex,
    DropFirst,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SimilarityArg {
    Cosine,
    InnerProduct,
    Euclidean,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PresetArg {
    Small,
    Sop,
}

impl From<PresetArg> for Preset {
    fn from(p: PresetArg) -> Self {
        match p {
            PresetArg::Small => Preset::Small,
            PresetArg::Sop => Preset::Sop,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(args) => eval(&args),
        Command::Fewshot(args) => fewshot(&args),
        Command::GenEmbeddings(args) => gen_embeddings(&args),
        Command::Train(args) => train(&args),
        Command::Compare(args) => compare(&args),
        Command::Tune(args) => tune(&args),
        Command::Embed(args) => embed(&args),
        Command::Reproduce(args) => reproduce(&args),
        Command::SynthData(args) => synth_data(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The inputs of one evaluation, loaded and checked.
struct Inputs {
    queries: LabelledEmbeddings,
    /// `None`: the queries are ranked against themselves.
    references: Option<LabelledEmbeddings>,
    /// A second model's embeddings of the same queries (and references), for `--versus`.
    versus: Option<(Tensor, Option<Tensor>)>,
    /// What was read, for the results' settings.
    sources: BTreeMap<String, String>,
}

fn eval(args: &EvalArgs) -> Result<()> {
    let started = Instant::now();
    let inputs = load_inputs(args)?;
    let device = parse_device(&args.device)?;
    if args.rerank.is_some() {
        check_rerank_options(args, &device)?;
    }
    let num_levels = inputs.queries.labels.num_levels();
    let relevance = relevance(args)?;
    relevance
        .validate(num_levels)
        .context("the relevance options do not fit the labels")?;
    if let Some(k) = args.recall_at.iter().find(|&&k| k == 0) {
        bail!("--recall-at: k must be at least 1, got {k}");
    }
    let self_match = match (args.self_match, inputs.references.is_some()) {
        (SelfMatchArg::Auto, false) => SelfMatch::SameIndex,
        (SelfMatchArg::Auto, true) => SelfMatch::None,
        (SelfMatchArg::None, _) => SelfMatch::None,
        (SelfMatchArg::SameIndex, _) => SelfMatch::SameIndex,
        (SelfMatchArg::DropFirst, _) => SelfMatch::DropFirst,
    };
    let defaults = EvalOptions::default();
    let opts = EvalOptions {
        recall_ks: args.recall_at.clone(),
        relevance,
        chunk_size: args.chunk_size.unwrap_or(defaults.chunk_size),
        self_match,
        similarity: match args.similarity {
            SimilarityArg::Cosine => Similarity::Cosine,
            SimilarityArg::InnerProduct => Similarity::InnerProduct,
            SimilarityArg::Euclidean => Similarity::Euclidean,
        },
        progress: !args.quiet,
        hierarchical: !args.no_hierarchical,
        per_level: !args.fine_only,
        device,
    };
    if opts.chunk_size == 0 {
        bail!("--chunk-size must be at least 1");
    }
    if !args.quiet {
        let against = match &inputs.references {
            Some(r) => format!("{} references", r.len()),
            None => "the others".to_string(),
        };
        eprintln!(
            "ranking {} queries against {against} ({} dims, {} label level(s): {}) on {}",
            inputs.queries.len(),
            inputs.queries.dim()?,
            num_levels,
            inputs.queries.level_names.join(", "),
            args.device
        );
    }
    // One model's embeddings scored: plainly or after re-ranking.
    let score = |queries: &Tensor, references: Option<&Tensor>| -> Result<EvalReport> {
        let labels = &inputs.queries.labels;
        let reference_labels = inputs.references.as_ref().map(|set| &set.labels);
        Ok(match &args.rerank {
            None => evaluate(queries, labels, references.zip(reference_labels), &opts)
                .context("evaluation failed")?,
            Some(method) => method
                .fit(queries, references)
                .with_context(|| format!("re-ranking ({method}) failed"))?
                .evaluate(labels, reference_labels, &opts)
                .context("evaluation failed")?,
        })
    };
    if let (Some(method), false) = (&args.rerank, args.quiet) {
        eprintln!("re-ranking: {method}");
    }
    let report = score(
        &inputs.queries.embeddings,
        inputs.references.as_ref().map(|set| &set.embeddings),
    )?;
    let versus = match &inputs.versus {
        Some((queries, references)) => {
            if !args.quiet {
                eprintln!("the second model (--versus):");
            }
            let other = score(queries, references.as_ref())?;
            Some(paired_differences(&report, &other)?)
        }
        None => None,
    };
    let table = result_table(&report, versus.as_deref(), &inputs, &opts, args);
    print_table(&table);
    if let Some(out) = &args.out {
        write_results(out, &table)?;
        if !args.quiet {
            eprintln!("wrote {}", out.display());
        }
    }
    if !args.quiet {
        eprintln!("done in {:.2} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Another model's embeddings of the items of `set` (read from `first`), for `--versus` and
/// `--concat`: the same number of rows (any dimension: two models may embed differently).
fn read_other_model(
    path: &Path,
    flag: &str,
    tensor: Option<&str>,
    set: &LabelledEmbeddings,
    first: &Path,
) -> Result<Tensor> {
    let x = rankwise::io::read_embeddings(path, tensor).with_context(|| flag.to_string())?;
    let (n, want) = (x.dim(0)?, set.len());
    if n != want {
        bail!(
            "{flag} {} has {n} rows but {} has {want}: another model's embeddings of the same \
             items are needed, in the same order",
            path.display(),
            first.display()
        );
    }
    Ok(x)
}

/// One set of items as the first model embedded it (read from the file named), for `--concat`.
type FirstModel<'a> = (&'a LabelledEmbeddings, &'a Path);

/// The first model's queries and references, if any, and each of `others` (other models'
/// embeddings of the same items: a queries file and, with references, a references file) as one
/// model, for `--concat` and `--concat-queries`/`--concat-references`
/// ([`rankwise::retrieval::ensemble::concatenate`]): the concatenated queries and references.
fn concatenated(
    queries: FirstModel,
    references: Option<FirstModel>,
    others: &[(PathBuf, Option<PathBuf>)],
    tensor: Option<&str>,
) -> Result<(Tensor, Option<Tensor>)> {
    use rankwise::retrieval::ensemble::{concatenate, TestEmbeddings};
    let (q_flag, r_flag) = match references {
        None => ("--concat", ""),
        Some(_) => ("--concat-queries", "--concat-references"),
    };
    let model = |q: Tensor, r: Option<Tensor>| TestEmbeddings {
        queries: q,
        query_labels: queries.0.labels.clone(),
        gallery: references
            .zip(r)
            .map(|((set, _), r)| (r, set.labels.clone())),
    };
    let mut models = vec![model(
        queries.0.embeddings.clone(),
        references.map(|(set, _)| set.embeddings.clone()),
    )];
    for (q_path, r_path) in others {
        let q = read_other_model(q_path, q_flag, tensor, queries.0, queries.1)?;
        let r = match (references, r_path) {
            (Some((set, first)), Some(path)) => {
                Some(read_other_model(path, r_flag, tensor, set, first)?)
            }
            _ => None,
        };
        models.push(model(q, r));
    }
    let one = concatenate(&models).context(q_flag)?;
    Ok((one.queries, one.gallery.map(|(r, _)| r)))
}

/// The options that `--rerank` cannot honour: the re-rankers compute on the CPU from cosine
/// similarities and remove a query from its own list exactly when it is ranked against itself.
fn check_rerank_options(args: &EvalArgs, device: &Device) -> Result<()> {
    if args.similarity != SimilarityArg::Cosine {
        bail!("--rerank works on cosine similarities (SSR's protocol): drop --similarity");
    }
    if !device.is_cpu() {
        bail!("--rerank runs on the CPU: drop --device {}", args.device);
    }
    if args.self_match != SelfMatchArg::Auto {
        bail!(
            "--rerank removes a query from its own list exactly when it is ranked against itself \
             (--embeddings): drop --self-match"
        );
    }
    Ok(())
}

/// Reads (or, with --example, generates) the embeddings and labels, checking every shape before
/// the ranking starts.
fn load_inputs(args: &EvalArgs) -> Result<Inputs> {
    if let Some(out) = &args.out {
        // Fail on a bad output name or folder now, not after a long evaluation.
        ResultFormat::from_path(out)?;
        check_output_file(out).context("--out")?;
    }
    let columns = (!args.label_columns.is_empty()).then_some(args.label_columns.as_slice());
    let tensor = args.tensor.as_deref();
    let mut sources = BTreeMap::new();
    if let Some(preset) = args.example {
        let preset = Preset::from(preset);
        let spec = SyntheticSpec::preset(preset).with_seed(args.seed);
        if !args.quiet {
            eprintln!(
                "generating the synthetic '{preset}' set: {} items, {} classes in {} coarse \
                 classes, D = {} (seed {})",
                spec.num_items, spec.num_fine_classes, spec.num_coarse_classes, spec.dim, spec.seed
            );
        }
        let set = spec.generate()?;
        sources.insert("example".into(), format!("{preset} (seed {})", args.seed));
        return Ok(Inputs {
            queries: LabelledEmbeddings {
                embeddings: set.embeddings,
                labels: set.labels,
                level_names: set.level_names,
            },
            references: None,
            versus: None,
            sources,
        });
    }
    match (
        (&args.embeddings, &args.labels),
        (&args.queries, &args.references),
        (&args.query_labels, &args.reference_labels),
    ) {
        ((Some(e), Some(l)), (None, None), (None, None)) => {
            let mut set = LabelledEmbeddings::read(e, l, columns, tensor)?;
            sources.insert("embeddings".into(), e.display().to_string());
            sources.insert("labels".into(), l.display().to_string());
            if !args.concat.is_empty() {
                let others: Vec<_> = args.concat.iter().map(|p| (p.clone(), None)).collect();
                set.embeddings = concatenated((&set, e), None, &others, tensor)?.0;
                let files: Vec<String> = args
                    .concat
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                sources.insert("concat".into(), files.join(","));
            }
            let versus = match &args.versus {
                Some(v) => {
                    sources.insert("versus".into(), v.display().to_string());
                    Some((read_other_model(v, "--versus", tensor, &set, e)?, None))
                }
                None => None,
            };
            Ok(Inputs {
                queries: set,
                references: None,
                versus,
                sources,
            })
        }
        ((None, None), (Some(q), Some(r)), (Some(ql), Some(rl))) => {
            let mut queries = LabelledEmbeddings::read(q, ql, columns, tensor)?;
            let mut references = LabelledEmbeddings::read(r, rl, columns, tensor)?;
            check_compatible_sets(&queries, q, &references, r)?;
            let (cq, cr) = (&args.concat_queries, &args.concat_references);
            if cq.len() != cr.len() {
                bail!(
                    "{} --concat-queries but {} --concat-references: each other model needs both, \
                     paired in the order given",
                    cq.len(),
                    cr.len()
                );
            }
            if !cq.is_empty() {
                let others: Vec<_> = cq
                    .iter()
                    .cloned()
                    .zip(cr.iter().cloned().map(Some))
                    .collect();
                let (cat_q, cat_r) =
                    concatenated((&queries, q), Some((&references, r)), &others, tensor)?;
                queries.embeddings = cat_q;
                references.embeddings = cat_r.expect("references were given");
                for (key, files) in [("concat_queries", cq), ("concat_references", cr)] {
                    let files: Vec<String> =
                        files.iter().map(|p| p.display().to_string()).collect();
                    sources.insert(key.into(), files.join(","));
                }
            }
            for (key, path) in [
                ("queries", q),
                ("references", r),
                ("query_labels", ql),
                ("reference_labels", rl),
            ] {
                sources.insert(key.into(), path.display().to_string());
            }
            let versus = match (&args.versus_queries, &args.versus_references) {
                (Some(vq), Some(vr)) => {
                    sources.insert("versus_queries".into(), vq.display().to_string());
                    sources.insert("versus_references".into(), vr.display().to_string());
                    let vq_t = read_other_model(vq, "--versus-queries", tensor, &queries, q)?;
                    let vr_t = read_other_model(vr, "--versus-references", tensor, &references, r)?;
                    let (dq, dr) = (vq_t.dim(1)?, vr_t.dim(1)?);
                    if dq != dr {
                        bail!(
                            "--versus-queries {} has dimension {dq} but --versus-references {} \
                             has dimension {dr}",
                            vq.display(),
                            vr.display()
                        );
                    }
                    Some((vq_t, Some(vr_t)))
                }
                _ => None,
            };
            Ok(Inputs {
                queries,
                references: Some(references),
                versus,
                sources,
            })
        }
        ((Some(_), None), _, _) => bail!("--embeddings needs --labels"),
        ((None, Some(_)), _, _) => bail!("--labels goes with --embeddings"),
        (_, (Some(_), Some(_)), _) => {
            bail!("--queries/--references need --query-labels and --reference-labels")
        }
        (_, _, (Some(_), Some(_))) => {
            bail!("--query-labels/--reference-labels go with --queries and --references")
        }
        _ => bail!(
            "nothing to evaluate: give --embeddings and --labels, or --queries, --references, \
             --query-labels and --reference-labels, or --example"
        ),
    }
}

fn relevance(args: &EvalArgs) -> Result<Relevance> {
    if !args.wap_weights.is_empty() && args.relevance != RelevanceKind::Wap {
        bail!("--wap-weights only applies to --relevance wap");
    }
    if args.no_count_query && args.relevance != RelevanceKind::Pop {
        bail!("--no-count-query only applies to --relevance pop");
    }
    if args.alpha != 1.0 && args.relevance == RelevanceKind::Wap {
        bail!("--alpha applies to --relevance pop and level, not wap (ΣwAP takes --wap-weights)");
    }
    Ok(match args.relevance {
        RelevanceKind::Pop => Relevance::Pop {
            alpha: args.alpha,
            count_query: !args.no_count_query,
        },
        RelevanceKind::Level => Relevance::Level { alpha: args.alpha },
        RelevanceKind::Wap => {
            if args.wap_weights.is_empty() {
                bail!("--relevance wap needs --wap-weights w1,…,wL (one per label level)");
            }
            Relevance::WeightedAp {
                weights: args.wap_weights.clone(),
            }
        }
    })
}

fn parse_device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(rankwise::device::open_cuda(0)?),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Ok(rankwise::device::open_cuda(i)?),
            _ => bail!("--device: '{other}' is not cpu, cuda or cuda:N"),
        },
    }
}

fn result_table(
    report: &EvalReport,
    versus: Option<&[PairedDifference]>,
    inputs: &Inputs,
    opts: &EvalOptions,
    args: &EvalArgs,
) -> ResultTable {
    let names = &inputs.queries.level_names;
    let rows = report
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| ResultRow {
            metric: r.metric.clone(),
            level: r.level,
            level_name: r.level.and_then(|l| names.get(l).cloned()),
            value: r.value,
            queries: r.queries,
            skipped: r.skipped,
            versus: versus.and_then(|v| v.get(i)).map(Versus::from),
        })
        .collect();
    let mut settings = inputs.sources.clone();
    settings.insert("label_levels".into(), names.join(","));
    settings.insert("relevance".into(), format!("{:?}", opts.relevance));
    settings.insert("self_match".into(), format!("{:?}", opts.self_match));
    settings.insert("similarity".into(), format!("{:?}", opts.similarity));
    settings.insert(
        "recall_at".into(),
        opts.recall_ks
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    settings.insert("hierarchical".into(), opts.hierarchical.to_string());
    settings.insert("per_level".into(), opts.per_level.to_string());
    settings.insert("device".into(), args.device.clone());
    settings.insert(
        "rerank".into(),
        args.rerank
            .map_or_else(|| "none".to_string(), |m| m.to_string()),
    );
    settings.insert(
        "rankwise_version".into(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    ResultTable {
        num_queries: report.num_queries,
        num_references: report.num_references,
        settings,
        rows,
    }
}

/// Prints the rows as an aligned table with six decimals (with --versus, the second model's
/// value, the difference, its 95% interval and the p-value); `--out` files keep full precision.
fn print_table(table: &ResultTable) {
    let versus = table.rows.iter().any(|r| r.versus.is_some());
    let cells: Vec<Vec<String>> = table
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.metric.clone(),
                r.level_name
                    .clone()
                    .unwrap_or_else(|| "(all levels)".into()),
                format!("{:.6}", r.value),
            ];
            if let Some(v) = &r.versus {
                row.extend([
                    format!("{:.6}", v.value),
                    format!("{:+.6}", v.difference),
                    format!("[{:+.6}, {:+.6}]", v.interval_low, v.interval_high),
                    format_p(v.p),
                ]);
            } else if versus {
                row.extend(std::iter::repeat_n(String::new(), 4));
            }
            row.extend([r.queries.to_string(), r.skipped.to_string()]);
            row
        })
        .collect();
    let mut header: Vec<String> = ["metric", "level", "value"].map(String::from).into();
    if versus {
        header.extend(["versus", "difference", "95% interval", "p"].map(String::from));
    }
    header.extend(["queries", "skipped"].map(String::from));
    print_aligned(&header, &cells);
}

/// Prints `header` and `cells` as columns two spaces apart: the first two left-aligned (names),
/// the rest right-aligned (numbers).
fn print_aligned(header: &[String], cells: &[Vec<String>]) {
    print_columns(header, cells, |i| i < 2);
}

/// [`print_aligned`] with the columns `left(i)` left-aligned, the others right-aligned.
fn print_columns(header: &[String], cells: &[Vec<String>], left: impl Fn(usize) -> bool) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for row in std::iter::once(header).chain(cells.iter().map(Vec::as_slice)) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                if left(i) {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

fn fewshot(args: &FewshotArgs) -> Result<()> {
    if let Some(out) = &args.out {
        // Fail on a bad output name or folder now, not after the episodes.
        ResultFormat::from_path(out)?;
        check_output_file(out).context("--out")?;
    }
    if let Some(path) = &args.per_episode {
        if ResultFormat::from_path(path)? != ResultFormat::Csv {
            bail!("--per-episode {}: write it as a .csv file", path.display());
        }
        check_output_file(path).context("--per-episode")?;
    }
    let columns = (!args.label_columns.is_empty()).then_some(args.label_columns.as_slice());
    let set = LabelledEmbeddings::read(
        &args.features,
        &args.labels,
        columns,
        args.tensor.as_deref(),
    )?;
    let level_name = set
        .level_names
        .get(args.level)
        .cloned()
        .unwrap_or_else(|| args.level.to_string());
    if args.level >= set.labels.num_levels() {
        bail!(
            "--level {}: {} has {} label column(s) ({})",
            args.level,
            args.labels.display(),
            set.labels.num_levels(),
            set.level_names.join(", ")
        );
    }
    let classes = set
        .labels
        .column(args.level)
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if !args.quiet {
        eprintln!(
            "{} items of {} classes (level {} '{level_name}'), D = {}; {} episodes per table, seed {}",
            set.labels.len(),
            classes,
            args.level,
            set.embeddings.dim(1)?,
            args.episodes,
            args.seed
        );
    }
    let first = args.classifiers[0].to_string();
    let mut rows = Vec::new();
    let mut per_episode = Vec::new();
    for &shots in &args.shots {
        let config = EpisodeConfig {
            ways: args.ways,
            shots,
            queries: args.queries,
            level: args.level,
            ..EpisodeConfig::default()
        };
        let started = Instant::now();
        let results = compare_methods(
            &args.classifiers,
            &set.embeddings,
            &set.labels,
            &config,
            args.episodes,
            args.seed,
        )
        .with_context(|| format!("{}-way {shots}-shot", args.ways))?;
        if !args.quiet {
            eprintln!(
                "{}-way {shots}-shot: {} classifier(s) in {:.1} s",
                args.ways,
                results.len(),
                started.elapsed().as_secs_f64()
            );
        }
        for r in &results {
            per_episode.extend(
                r.run
                    .accuracies
                    .iter()
                    .enumerate()
                    .map(|(episode, &accuracy)| EpisodeAccuracy {
                        ways: args.ways,
                        shots,
                        episode,
                        classifier: r.run.method.clone(),
                        accuracy,
                    }),
            );
        }
        rows.extend(results.into_iter().map(|r| FewShotRow {
            ways: args.ways,
            shots,
            queries: args.queries,
            episodes: r.accuracy.episodes,
            classifier: r.run.method,
            chosen: r.run.chosen,
            accuracy: r.accuracy.mean,
            std: r.accuracy.std,
            half_width: r.accuracy.half_width,
            versus: r.versus_first.map(|d| EpisodeVersus {
                classifier: first.clone(),
                difference: d.mean,
                interval_low: d.interval.0,
                interval_high: d.interval.1,
                p: d.p,
            }),
        }));
    }
    let settings = BTreeMap::from([
        ("features".to_string(), args.features.display().to_string()),
        ("labels".to_string(), args.labels.display().to_string()),
        (
            "level".to_string(),
            format!("{} ({level_name})", args.level),
        ),
        ("seed".to_string(), args.seed.to_string()),
        ("shuffle_queries".to_string(), "true".to_string()),
        (
            "rankwise".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ]);
    let table = FewShotTable { settings, rows };
    print_fewshot_table(&table);
    if let Some(out) = &args.out {
        write_fewshot_results(out, &table)?;
        if !args.quiet {
            eprintln!("wrote {}", out.display());
        }
    }
    if let Some(path) = &args.per_episode {
        write_episode_accuracies(path, &per_episode)?;
        if !args.quiet {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn print_fewshot_table(table: &FewShotTable) {
    let header: Vec<String> = [
        "N-way K-shot",
        "classifier",
        "accuracy",
        "± 95%",
        "vs first",
        "95% interval",
        "p",
    ]
    .map(String::from)
    .into();
    let cells: Vec<Vec<String>> = table
        .rows
        .iter()
        .map(|r| {
            let classifier = match &r.chosen {
                Some(c) => format!("{} ({c})", r.classifier),
                None => r.classifier.clone(),
            };
            let mut row = vec![
                format!("{}-way {}-shot", r.ways, r.shots),
                classifier,
                format!("{:.2}", r.accuracy),
                format!("{:.2}", r.half_width),
            ];
            match &r.versus {
                Some(v) => row.extend([
                    format!("{:+.2}", v.difference),
                    format!("[{:+.2}, {:+.2}]", v.interval_low, v.interval_high),
                    format_p(v.p),
                ]),
                None => row.extend(std::iter::repeat_n(String::new(), 3)),
            }
            row
        })
        .collect();
    print_aligned(&header, &cells);
}

fn gen_embeddings(args: &GenArgs) -> Result<()> {
    let preset = Preset::from(args.preset);
    let spec = SyntheticSpec::preset(preset).with_seed(args.seed);
    let set = spec.generate()?;
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let embeddings = args.out_dir.join("embeddings.npy");
    let labels = args.out_dir.join("labels.csv");
    write_npy(&embeddings, &set.embeddings)?;
    write_labels_csv(&labels, &set.labels, &set.level_names)?;
    let (n, d) = set.embeddings.dims2()?;
    println!(
        "wrote {} ({n} × {d} float32, rows of unit norm) and {} ({n} lines: {})",
        embeddings.display(),
        labels.display(),
        set.level_names.join(",")
    );
    println!(
        "evaluate with: rankwise eval --embeddings {} --labels {}",
        quote(&embeddings),
        quote(&labels)
    );
    Ok(())
}

/// A path as a shell word (quoted when it holds spaces).
fn quote(path: &Path) -> String {
    let s = path.display().to_string();
    if s.contains(char::is_whitespace) {
        format!("'{s}'")
    } else {
        s
    }
}

/// The recipe with its `--set` overrides and `--device`.
fn load_recipe(path: &Path, set: &[String], device: Option<&str>) -> Result<TrainConfig> {
    let mut config = load_with_overrides(path, set)?;
    if let Some(d) = device {
        config.device = DeviceChoice::parse(d).context("--device")?;
        // Named here as the flag it came from, before any data is read.
        config
            .device
            .check_available()
            .with_context(|| format!("--device {d}"))?;
    }
    Ok(config)
}

fn train(args: &TrainArgs) -> Result<()> {
    rankwise::cpu::alloc::tune_allocator();
    rankwise::cpu::threads::tune_candle_threads();
    let started = Instant::now();
    let mut config = load_recipe(&args.config, &args.set, args.device.as_deref())?;
    config.progress = !args.quiet;
    if let Some(validation) = &config.validation {
        validation.check_fold()?;
    }
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => {
            let stem = args
                .config
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_else(|| "run".into());
            PathBuf::from("runs").join(stem)
        }
    };
    if !args.quiet {
        eprintln!(
            "training {} epoch(s) from {}{} into {} ({} rayon threads)",
            config.epochs,
            args.config.display(),
            if args.set.is_empty() {
                String::new()
            } else {
                format!(" with {}", args.set.join(" "))
            },
            out.display(),
            rayon::current_num_threads()
        );
    }
    let options = RunOptions {
        recipe: Some(args.config.clone()),
        overrides: args.set.clone(),
        reuse: match (args.resume, args.overwrite) {
            (true, _) => Reuse::Resume,
            (_, true) => Reuse::Overwrite,
            _ => Reuse::Refuse,
        },
    };
    let results = train_to_dir(config, &out, &options)?;
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    println!(
        "R@1 (fine, first test split): untrained {} → epoch {} {}",
        fmt(results.r_at_1_untrained),
        results.final_epoch,
        fmt(results.r_at_1_final)
    );
    if let Some(s) = &results.selection {
        let first = s
            .first_test_set()
            .next()
            .map_or("test", |r| r.split.as_str());
        println!(
            "selected by val {}{} {:.4}: epoch {}, R@1 (fine, {first}) {} (network in {})",
            s.metric,
            s.level.map_or(String::new(), |l| format!(" (level {l})")),
            s.value,
            s.epoch,
            fmt(s.test(first, "R@1", Some(0))),
            out.join(rankwise::train::trainer::BEST_CHECKPOINT_FILE)
                .display()
        );
    }
    println!(
        "wrote {} ({} epochs, {} steps) in {:.1} s",
        out.join(RESULTS_FILE).display(),
        results.epochs,
        results.steps,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A value of the library's own syntax (`FromStr` with the library's error: `--rerank`'s
/// method, an arm, a metric, …), for clap, whose error then names the forms.
fn parse_lib<T: std::str::FromStr<Err = rankwise::Error>>(
    s: &str,
) -> std::result::Result<T, String> {
    s.parse().map_err(|e: rankwise::Error| e.to_string())
}

/// The start of `compare` and `tune`: the CPU settings, and the output file checked, since every
/// input is checked before the first run trains (a bad name is no reason to lose hours).
fn start_search(out: Option<&PathBuf>) -> Result<Instant> {
    rankwise::cpu::alloc::tune_allocator();
    rankwise::cpu::threads::tune_candle_threads();
    if let Some(out) = out {
        ResultFormat::from_path(out)?;
        check_output_file(out)?;
    }
    Ok(Instant::now())
}

fn compare(args: &CompareArgs) -> Result<()> {
    let started = start_search(args.out.as_ref())?;
    let seeds = args.runs.seed_list()?;
    experiments::compare::check_looks(&args.looks, seeds.len())?;
    let mut arms = Vec::with_capacity(args.arms.len());
    for spec in &args.arms {
        let mut arm = spec.resolve(&args.config, &args.set)?;
        args.runs.set_device(&mut arm)?;
        arms.push(arm);
    }
    let (runner, jobs) = args
        .runs
        .runner(&format!("comparing {} arms", arms.len()), &seeds)?;
    let comparison = experiments::compare::compare(
        &runner,
        &arms,
        &seeds,
        jobs,
        &args.metrics,
        &args.looks,
        args.at,
    )?;
    print_comparison(&comparison);
    if let Some(out) = &args.out {
        write_comparison(out, &comparison)?;
        println!("wrote {}", out.display());
    }
    if !args.runs.quiet {
        eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

fn tune(args: &TuneArgs) -> Result<()> {
    let started = start_search(args.out.as_ref())?;
    let seeds = args.runs.seed_list()?;
    let search = match args.samples {
        Some(_) if args.sample.is_empty() => {
            bail!("--samples goes with --sample (a random search); a grid (--grid) trains every point")
        }
        Some(samples) => Search::Random {
            ranges: args.sample.clone(),
            samples,
            seed: args.sample_seed,
        },
        None => Search::Grid {
            axes: args.grid.clone(),
        },
    };
    if let Some(dir) = args.figures.as_ref().filter(|d| d.exists() && !d.is_dir()) {
        bail!("--figures {} is a file, not a folder", dir.display());
    }
    let mut arms = experiments::tune::candidates(&args.config, &args.set, &search)?;
    for arm in &mut arms {
        args.runs.set_device(arm)?;
    }
    let (runner, jobs) = args.runs.runner(
        &format!("searching {}", points_text(&search, &arms)),
        &seeds,
    )?;
    let tuning = experiments::tune::tune(&runner, &search, &arms, &seeds, jobs, &args.metrics)?;
    print_tuning(&tuning);
    if let Some(out) = &args.out {
        write_tuning(out, &tuning)?;
        println!("wrote {}", out.display());
    }
    if let Some(dir) = &args.figures {
        for (key, chart) in tuning.charts() {
            let stem = format!(
                "tune_{}",
                key.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            );
            let files = rankwise::report::line_chart(&chart, dir, &stem)?;
            println!("wrote {} and {}", files.png.display(), files.svg.display());
        }
    }
    if !args.runs.quiet {
        eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// `N grid points` (or `N random points (drawn with seed S)`), with ` × K folds` for a search
/// cross-validated over K folds.
fn points_text(search: &Search, arms: &[experiments::compare::Arm]) -> String {
    let folds = arms
        .first()
        .and_then(|a| a.config.validation.as_ref())
        .map_or(1, |v| v.cross_validation_folds());
    format!("{}{}", search.describe(), folds_text(folds))
}

/// ` × K folds` for a search cross-validated over K folds; nothing for a single split.
fn folds_text(folds: usize) -> String {
    match folds {
        1 => String::new(),
        k => format!(" × {k} folds"),
    }
}

/// Every point's validation and test values, then the reading.
fn print_tuning(t: &Tuning) {
    let seeds = t.seeds.len();
    let metric = t.selection_metric_name();
    println!(
        "{} × {seeds} seeds ({}–{}){}, device {}, run code {}; chosen on {}, by validation \
         {metric}",
        t.search.describe(),
        t.seeds[0],
        t.seeds[seeds - 1],
        folds_text(t.folds()),
        t.devices.join(", "),
        t.run_code,
        t.held_out_text()
    );
    let mut header: Vec<String> = vec![
        "point".into(),
        format!("val {metric}"),
        "vs chosen (Holm p)".into(),
        "epochs".into(),
    ];
    for (m, l) in &t.metrics {
        header.push(format!("test {}", metric_label(m, *l)));
    }
    let cells: Vec<Vec<String>> = t
        .display_order()
        .into_iter()
        .map(|i| (i, &t.candidates[i]))
        .map(|(i, c)| {
            let mark = match (i == t.chosen, Some(i) == t.test_choice) {
                (true, true) => " [chosen; test's choice too]",
                (true, false) => " [chosen]",
                (false, true) => " [test's choice]",
                _ => "",
            };
            let versus = c.versus_chosen.as_ref().map_or("—".to_string(), |v| {
                format!("{} ({})", v.finding.as_str(), format_p(v.p_holm))
            });
            let mut row = vec![
                format!("{}{mark}", c.label),
                format!("{:.4} ± {:.4}", c.validation.mean, c.validation.half_width),
                versus,
                epochs_text(&c.selected_epochs, seeds),
            ];
            row.extend(
                c.test
                    .iter()
                    .map(|a| format!("{:.4} ± {:.4}", a.mean, a.half_width)),
            );
            row
        })
        .collect();
    println!();
    print_columns(&header, &cells, |i| i == 0 || i == 2);
    // Each fold's own ranking of the points, beside the mean the choice is made on.
    let choices = t.fold_choices();
    if !choices.is_empty() {
        let mut header = vec!["point".to_string()];
        header.extend((0..choices.len()).map(|f| format!("val {metric} fold {f}")));
        let cells: Vec<Vec<String>> = t
            .display_order()
            .into_iter()
            .map(|i| (i, &t.candidates[i]))
            .map(|(i, c)| {
                let mut row = vec![c.label.clone()];
                row.extend(c.fold_means().iter().zip(&choices).map(|(mean, &best)| {
                    format!("{mean:.4}{}", if best == Some(i) { " *" } else { "" })
                }));
                row
            })
            .collect();
        println!("\nEach fold alone (mean over the seeds; * the fold's own choice):");
        print_columns(&header, &cells, |i| i == 0);
    }
    // The fold models as one (Musgrave et al.'s concatenated result) beside their mean.
    if t.candidates[0].concatenated.len() == t.metrics.len() {
        let mut header = vec!["point".to_string()];
        header.extend(
            t.metrics
                .iter()
                .map(|(m, l)| format!("test {}", metric_label(m, *l))),
        );
        header.push(format!("− separated {metric} (p)"));
        let cells: Vec<Vec<String>> = t
            .display_order()
            .into_iter()
            .map(|i| (i, &t.candidates[i]))
            .map(|(i, c)| {
                let mut row = vec![c.label.clone()];
                row.extend(
                    c.concatenated
                        .iter()
                        .map(|a| format!("{:.4} ± {:.4}", a.mean, a.half_width)),
                );
                row.push(t.concatenation_gain(i).map_or("—".into(), |g| {
                    format!("{:+.4} ({})", g.mean, format_p(g.p))
                }));
                row
            })
            .collect();
        println!(
            "\nThe {} fold models as one (their embeddings at the selected epochs concatenated, \
             each L2-normalised):",
            t.folds()
        );
        print_columns(&header, &cells, |i| i == 0);
        println!(
            "(− separated: the fold models as one minus their mean, seed by seed; the paired \
             t-test over the {seeds} seeds, each point on its own.)"
        );
    }
    println!(
        "\nValues: mean ± half-width of the 95% interval over the seeds, each run read at the \
         epoch its validation selected{}. vs chosen: each point − the chosen one on validation, \
         the paired t-test over the {seeds} seeds, Holm-corrected over the {} other points.\n",
        match t.folds() {
            1 => String::new(),
            k => format!(
                ", each seed's value the mean of its {k} fold runs (epochs: fold by fold, `|` \
                 between folds)"
            ),
        },
        t.candidates.len() - 1
    );
    println!("{}", t.reading());
}

/// Selected epochs listed seed by seed, folds (groups of `seeds`) separated by ` | `.
fn epochs_text(epochs: &[u64], seeds: usize) -> String {
    epochs
        .chunks(seeds.max(1))
        .map(|fold| {
            let e: Vec<String> = fold.iter().map(u64::to_string).collect();
            e.join(" ")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The arms' means, then each arm against the baseline, then how to read them.
fn print_comparison(c: &SeedComparison) {
    let seeds = c.seeds.len();
    println!(
        "{} arms × {seeds} seeds ({}–{}), device {}, run code {}",
        c.arms.len(),
        c.seeds[0],
        c.seeds[seeds - 1],
        c.devices.join(", "),
        c.run_code
    );
    if c.reading == Reading::Selected {
        // The epochs say how far from the last one the validation reached.
        let epochs: Vec<String> = c
            .arms
            .iter()
            .zip(&c.selected_epochs)
            .map(|(a, e)| {
                let e: Vec<String> = e.iter().map(u64::to_string).collect();
                format!("{} {}", a.label, e.join(" "))
            })
            .collect();
        println!(
            "test metrics at the epoch each run's validation selected: {}",
            epochs.join("; ")
        );
    }
    let level_of = |l: Option<usize>| l.map_or("-".to_string(), |l| l.to_string());
    let mut header = vec!["metric".to_string(), "level".to_string()];
    header.extend(c.arms.iter().map(|a| a.label.clone()));
    let cells: Vec<Vec<String>> = c
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![r.metric.clone(), level_of(r.level)];
            row.extend(
                r.arms
                    .iter()
                    .map(|a| format!("{:.4} ± {:.4}", a.mean, a.half_width)),
            );
            row
        })
        .collect();
    println!();
    print_aligned(&header, &cells);
    let header: Vec<String> = [
        "metric",
        "level",
        "arm",
        "− baseline",
        "95% interval",
        "p",
        "Holm p",
        "finding",
    ]
    .map(String::from)
    .into();
    let mut cells = Vec::new();
    let mut level = None;
    for r in &c.rows {
        for v in &r.versus {
            level = Some(v.alpha);
            let finding = match (v.finding, v.seeds_to_decide, v.beyond) {
                (Finding::InsideTheNoise, Some(n), _) => {
                    format!("inside the noise (≈ {n} seeds to decide)")
                }
                (Finding::InsideTheNoise, None, true) => format!(
                    "inside the noise (a tie: > {} seeds)",
                    rankwise::stats::SEEDS_CAP
                ),
                (f, _, _) => f.as_str().to_string(),
            };
            cells.push(vec![
                r.metric.clone(),
                level_of(r.level),
                v.arm.clone(),
                format!("{:+.4}", v.difference),
                format!("[{:+.4}, {:+.4}]", v.interval_low, v.interval_high),
                format_p(v.p),
                format_p(v.p_holm),
                finding,
            ]);
        }
    }
    println!();
    // Names left, numbers right, the finding (words) left.
    let last = header.len() - 1;
    print_columns(&header, &cells, |i| i < 3 || i == last);
    let level = level.unwrap_or(rankwise::stats::ALPHA);
    println!(
        "\nValues: mean ± half-width of the 95% interval over the seeds. Each arm − {}: the \
         paired t-test over the {seeds} seeds' differences (two-sided, {} degrees of freedom), \
         Holm-corrected over the {} comparisons, at {:.2}%{}. Inside the noise, `≈ m seeds` is \
         the count per arm at which the same gap and noise would be decided.",
        c.arms[0].label,
        seeds - 1,
        cells.len(),
        100.0 * level,
        if c.looks.is_empty() {
            String::new()
        } else {
            format!(
                " (Pocock's per-look level: read before at {:?} seeds)",
                c.looks
            )
        }
    );
}

/// Column names of the label file: the embedded dataset's levels by name, otherwise
/// `level0` (finest), `level1`, ….
fn level_names(config: &TrainConfig, levels: usize) -> Vec<String> {
    if config.dataset.embedded().is_some() && levels == 3 {
        return ["fine", "variant", "family"].map(String::from).to_vec();
    }
    (0..levels).map(|l| format!("level{l}")).collect()
}

fn embed(args: &EmbedArgs) -> Result<()> {
    rankwise::cpu::alloc::tune_allocator();
    rankwise::cpu::threads::tune_candle_threads();
    if ext(&args.out).as_deref() != Some("npy") {
        bail!(
            "--out {}: write embeddings to a .npy file",
            args.out.display()
        );
    }
    if let Some(l) = &args.labels_out {
        if ext(l).as_deref() != Some("csv") {
            bail!("--labels-out {}: write labels to a .csv file", l.display());
        }
    }
    check_output_file(&args.out).context("--out")?;
    if let Some(l) = &args.labels_out {
        check_output_file(l).context("--labels-out")?;
    }
    if !args.checkpoint.is_file() {
        bail!("--checkpoint {}: no such file", args.checkpoint.display());
    }
    let mut config = load_recipe(&args.config, &args.set, args.device.as_deref())?;
    config.progress = !args.quiet;
    config.output.dir = None;
    config.resume = Some(args.checkpoint.clone());
    let split = match args.split {
        SplitArg::Train => "train",
        SplitArg::Test => "test",
        SplitArg::Query => "query",
        SplitArg::Gallery => "gallery",
        SplitArg::Val => "val",
    };
    let trainer = Trainer::from_config(config.clone()).map_err(|e| blame(e, &args.set))?;
    let (embeddings, labels) = trainer.embed_split(split)?;
    write_npy(&args.out, &embeddings)?;
    let (n, d) = embeddings.dims2()?;
    println!("wrote {} ({n} × {d} float32)", args.out.display());
    if let Some(path) = &args.labels_out {
        let names = level_names(&config, labels.num_levels());
        write_labels_csv(path, &labels, &names)?;
        println!("wrote {} ({n} lines: {})", path.display(), names.join(","));
    }
    Ok(())
}

fn reproduce(args: &ReproduceArgs) -> Result<()> {
    rankwise::cpu::alloc::tune_allocator();
    rankwise::cpu::threads::tune_candle_threads();
    let scale: Scale = match &args.scale {
        Some(s) => s.parse().context("--scale")?,
        None => experiments::scale_from_env(Scale::Quick)?,
    };
    let started = Instant::now();
    let mut dirs = ReproduceDirs::defaults(&args.root, scale);
    if let Some(t) = &args.tables_dir {
        dirs.tables = t.clone();
    }
    if let Some(f) = &args.figures_dir {
        dirs.figures = f.clone();
    }
    if let Some(r) = &args.runs_dir {
        dirs.runs = Some(r.clone());
    }
    dirs.runs_of = args.runs_of.clone();
    experiments::reproduce(&args.papers, scale, &dirs, true, &mut std::io::stdout())?;
    println!("done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn synth_data(args: &SynthDataArgs) -> Result<()> {
    let started = Instant::now();
    let (recipe, kind, mut spec) = match (&args.config, &args.kind) {
        (Some(path), _) => {
            let config = load_with_overrides(path, &args.set)?;
            let (kind, spec) =
                OnDiskSpec::for_recipe(&config.dataset, &config.sampler, args.batches)
                    .with_context(|| {
                        format!("sizing a synthetic dataset for {}", path.display())
                    })?;
            (Some((path, config)), kind, spec)
        }
        (None, Some(kind)) => (None, kind.parse::<SyntheticKind>()?, OnDiskSpec::default()),
        (None, None) => bail!("give --config (a recipe) or --kind (a dataset format)"),
    };
    for (value, field) in [
        (args.train_classes, &mut spec.train_classes),
        (args.images_per_class, &mut spec.train_images_per_class),
        (args.test_classes, &mut spec.test_classes),
        (args.test_images_per_class, &mut spec.test_images_per_class),
        (args.super_classes, &mut spec.super_classes),
    ] {
        if let Some(v) = value {
            *field = v;
        }
    }
    spec.image_size = args.image_size;
    spec.seed = args.seed;
    if args.force {
        remove_synthetic(&args.root)?;
    }
    let written = write_dataset(kind, &args.root, &spec)?;
    println!(
        "wrote a synthetic {kind} dataset to {}: {} training images ({} classes × {}), {} test \
         images ({} classes × {}), {} super-classes, {} files, {:.1} MB, in {:.1} s",
        written.root.display(),
        written.train_images,
        spec.train_classes,
        spec.train_images_per_class,
        written.test_images,
        spec.test_classes,
        spec.test_images_per_class,
        spec.super_classes,
        written.files,
        written.bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    if let Some((path, config)) = recipe {
        // Read it back as the recipe will: its loader, the file check and its sampler.
        let check = check_recipe(&config.with_dataset_root(&args.root)?)
            .with_context(|| format!("the dataset written does not serve {}", path.display()))?;
        let tests: Vec<String> = check
            .test_sets
            .iter()
            .map(|(split, q, g)| match g {
                Some(g) => format!("{split} {q} queries vs {g}"),
                None => format!("{split} {q} images"),
            })
            .collect();
        println!(
            "{}: epoch 0 has {} batches ({} full); test: {}",
            path.display(),
            check.batches,
            check.full_batches,
            tests.join(", ")
        );
    }
    println!("train with: --set dataset.root={}", quote(&args.root));
    Ok(())
}

/// The lower-case extension of `path`.
fn ext(path: &Path) -> Option<String> {
    path.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
}

//! The training loop: epochs of batches from a sampler, a rank loss, parameter groups with their
//! schedule and HAPPIER's backbone warm-up, periodic retrieval evaluation, a metrics log, and
//! checkpoints from which training resumes bit-identically.
//!
//! **Data.** The trainer draws batches from an [`ImageSource`]: the embedded dataset in memory,
//! or a real dataset decoded from disk by the image pipeline, the next batches being decoded in
//! the background while the current one trains ([`super::data`]). Evaluation follows the
//! dataset's own protocol ([`TestProtocol`]).
//!
//! **Determinism.** Everything random is seeded: the initial weights ([`ParamStore`], by seed
//! and variable name), the batches (a pure function of the sampler seed and the epoch, see
//! [`crate::samplers`]) and the augmentation of real images (a pure function of the seed, the
//! epoch and the image index, [`crate::data::pipeline::sample_rng`], whatever the number of
//! decoding threads). There is no dropout, so no other generator state exists. A checkpoint
//! stores the variables (weights and BatchNorm statistics), the optimizer state (moments,
//! momentum buffers, step counts, learning rates, on/off switches), the [`SamplerState`] and the
//! step counter; the learning rate of every later step is a pure function of those. On the CPU
//! candle's kernels are deterministic for a fixed thread count, so `N` epochs in one go and `k`
//! epochs + resume + `N − k` epochs give the same bits (tested, on the embedded dataset and on
//! images read from disk).

use super::checkpoint;
use super::config::TrainConfig;
use super::data::{load_data, RunData, TestProtocol};
use super::large_batch::{chunked_gradients, direct_gradients};
use super::log::MetricsLog;
use super::optim::{GroupState, Optimizer, ParamGroup};
use super::schedule::{BackboneWarmup, ScheduleUnit};
use super::validation::{self, Selection, ValidationConfig, VALIDATION_SPLIT};
use crate::data::source::{ImageSource, View};
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::losses::config::LossContext;
use crate::losses::RankLoss;
use crate::models::{EmbeddingNet, ParamStore, BACKBONE_PREFIX, HEAD_PREFIX};
use crate::progress::Progress;
use crate::retrieval::dyml::{evaluate_dyml, DymlResult, DymlScale};
use crate::retrieval::ensemble::TestEmbeddings;
use crate::retrieval::{evaluate, EvalOptions, EvalReport};
use crate::samplers::DynSampler;
use crate::samplers::SamplerState;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Name of the backbone's parameter group.
pub const BACKBONE_GROUP: &str = "backbone";
/// Name of the head's parameter group.
pub const HEAD_GROUP: &str = "head";
/// Name of the parameter group of the loss's own variables (proxies), present only for losses
/// that have some.
pub const LOSS_GROUP: &str = "loss";
/// Checkpoint file name in the output folder.
pub const CHECKPOINT_FILE: &str = "checkpoint.safetensors";
/// The checkpoint of the epoch the validation selected ([`super::validation`]), in the output
/// folder of a run with a `[validation]` table: rewritten at each new best validation value.
pub const BEST_CHECKPOINT_FILE: &str = "best.safetensors";
/// Metrics file names in the output folder.
pub const METRICS_CSV: &str = "metrics.csv";
/// Parquet version of the metrics.
pub const METRICS_PARQUET: &str = "metrics.parquet";
/// Identifies the checkpoint layout.
const CHECKPOINT_FORMAT: &str = "rankwise-train-1";

/// The JSON document of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointMeta {
    format: String,
    sampler: SamplerState,
    global_step: u64,
    optimizer: Vec<GroupState>,
    config: TrainConfig,
    log: MetricsLog,
    /// The loss's state ([`RankLoss::state_json`]), e.g. RaMBO's score memory.
    #[serde(default)]
    loss_state: Option<String>,
}

/// What one epoch did.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochSummary {
    /// 1-based index of the epoch.
    pub epoch: u64,
    /// Mean loss over its batches.
    pub mean_loss: f64,
    /// Training images per second (forward, backward and optimizer step).
    pub images_per_s: f64,
    /// Number of batches.
    pub batches: usize,
    /// Whether the backbone was frozen (warm-up).
    pub backbone_frozen: bool,
}

/// One evaluation of the test protocol ([`Trainer::evaluate`]).
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// `(split, report)` of every test set evaluated on its own, in the protocol's order
    /// (`test`; VehicleID: `test_small`, `test_medium`, `test_large`). Empty for DyML-Vehicle /
    /// -Animal.
    pub reports: Vec<(String, EvalReport)>,
    /// The DyML protocol's per-scale and averaged mAP, ASI and R@1 (DyML-Vehicle / -Animal).
    pub dyml: Option<DymlResult>,
    /// The held-out training classes' report (split `val`), in a run with a `[validation]`
    /// table.
    pub validation: Option<EvalReport>,
}

impl Evaluation {
    /// The report of the test set logged under `split`.
    pub fn report(&self, split: &str) -> Option<&EvalReport> {
        self.reports
            .iter()
            .find(|(s, _)| s == split)
            .map(|(_, r)| r)
    }
}

/// What [`Trainer::fit`] returns.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// The metrics log of the whole run (including epochs before a resume).
    pub log: MetricsLog,
    /// The last evaluation of this session, if any.
    pub last_eval: Option<Evaluation>,
    /// The summaries of the epochs trained in this session.
    pub epochs: Vec<EpochSummary>,
    /// The epoch the validation selected and its test metrics, in a run with a `[validation]`
    /// table ([`Trainer::selection`]).
    pub selection: Option<Selection>,
}

/// A training run in progress.
pub struct Trainer<'a> {
    config: TrainConfig,
    device: Device,
    params: ParamStore,
    model: EmbeddingNet,
    optimizer: Optimizer,
    sampler: DynSampler,
    sampler_state: SamplerState,
    loss: Box<dyn RankLoss + 'a>,
    /// Whether `loss` was built from `config.loss` (then a resumed checkpoint must have the same).
    loss_from_config: bool,
    train: Arc<dyn ImageSource>,
    test: TestProtocol,
    /// The held-out training classes, with a `[validation]` table.
    validation: Option<Arc<dyn ImageSource>>,
    global_step: u64,
    log: MetricsLog,
    /// What [`Trainer::keep_selected_test_embeddings`] keeps: `None` when not asked.
    kept: Option<KeptTest>,
}

/// The first test set's embeddings kept through a run, to read its selected epoch's network on
/// the test set after training (an ensemble of fold models, [`crate::retrieval::ensemble`])
/// without writing a checkpoint per epoch.
#[derive(Default)]
struct KeptTest {
    /// The latest evaluation's, until [`Trainer::keep_if_best`] looks at it.
    latest: Option<TestEmbeddings>,
    /// The selected evaluation's, and its epoch.
    selected: Option<(u64, TestEmbeddings)>,
}

impl<'a> Trainer<'a> {
    /// A trainer on the data of `config.dataset` (the embedded dataset or a real dataset on
    /// disk) with the given loss (which replaces `config.loss`), resuming
    /// from `config.resume` if set.
    pub fn new(config: TrainConfig, loss: &'a dyn RankLoss) -> Result<Self> {
        let data = load_data(&config)?;
        Self::with_run_data(config, data, loss)
    }

    /// A trainer on given in-memory training and evaluation images (`config.dataset` is not
    /// used; test images are queries against each other) with the given
    /// loss (which replaces `config.loss`), resuming from `config.resume` if set.
    pub fn with_data(
        config: TrainConfig,
        train_set: ImageSet,
        test_set: ImageSet,
        loss: &'a dyn RankLoss,
    ) -> Result<Self> {
        let data = RunData::in_memory(train_set, test_set, config.input_norm)?;
        Self::with_run_data(config, data, loss)
    }

    /// A trainer on given training images and test protocol (`config.dataset` is not used)
    /// with the given loss (which replaces `config.loss`).
    pub fn with_run_data(
        config: TrainConfig,
        data: RunData,
        loss: &'a dyn RankLoss,
    ) -> Result<Self> {
        Self::assemble(config, data, |_, _| Ok(Box::new(loss)), false)
    }

    /// A trainer on the data of `config` with the loss of `config.loss`: what
    /// `rankwise train --config` runs.
    pub fn from_config(config: TrainConfig) -> Result<Trainer<'static>> {
        let data = load_data(&config)?;
        Trainer::from_config_with_run_data(config, data)
    }

    /// A trainer on given in-memory images with the loss of `config.loss` (proxy losses get one
    /// proxy per class of `train_set`, seeded by `config.seed`).
    pub fn from_config_with_data(
        config: TrainConfig,
        train_set: ImageSet,
        test_set: ImageSet,
    ) -> Result<Trainer<'static>> {
        let data = RunData::in_memory(train_set, test_set, config.input_norm)?;
        Trainer::from_config_with_run_data(config, data)
    }

    /// A trainer on given training images and test protocol with the loss of `config.loss`.
    pub fn from_config_with_run_data(
        config: TrainConfig,
        data: RunData,
    ) -> Result<Trainer<'static>> {
        Trainer::assemble(config, data, |config, ctx| config.loss.build(ctx), true)
    }

    fn assemble(
        config: TrainConfig,
        data: RunData,
        make_loss: impl FnOnce(&TrainConfig, &LossContext<'_>) -> Result<Box<dyn RankLoss + 'a>>,
        loss_from_config: bool,
    ) -> Result<Self> {
        config.validate()?;
        // Held out before anything sees the data: the pretraining stage, the loss's proxies and
        // the sampler know only the kept classes.
        let (data, validation) = match &config.validation {
            Some(v) => {
                let (data, val) = data.hold_out(v)?;
                let levels = val.labels().num_levels();
                if let (_, Some(level)) = v.metric()? {
                    if level >= levels {
                        return Err(Error::invalid(
                            "validation.metric",
                            format!(
                                "`{}`: the labels have levels 0..{levels} (0 = finest)",
                                v.metric
                            ),
                        ));
                    }
                }
                (data, Some(val))
            }
            None => (data, None),
        };
        let device = config.device.device()?;
        let params = ParamStore::new(config.seed);
        let model = EmbeddingNet::new(&config.model, params.var_builder(DType::F32, &device))?;
        if let Some(spec) = &config.pretrained {
            crate::models::pretrained::load_backbone(&params, spec)?;
        }
        // A resumed run's checkpoint holds its network: the stage would be overwritten.
        if let (Some(stage), None) = (config.pretrain_recipe(), &config.resume) {
            let weights = pretrain(stage, &data)
                .map_err(|e| Error::invalid("pretrain", format!("the stage failed: {e}")))?;
            params.assign_all(&weights, Path::new("[pretrain]"))?;
        }
        if config.large_batch_chunk.is_some() && model.uses_batch_statistics() {
            return Err(Error::invalid(
                "large_batch_chunk",
                "chunked embedding gives the exact gradient only without batch statistics: \
                 freeze the BatchNorm layers (frozen_bn = true) or drop large_batch_chunk",
            ));
        }
        let RunData { train, test } = data;
        let test_sources = test
            .sets()
            .iter()
            .flat_map(|set| std::iter::once(&set.queries).chain(&set.gallery));
        for source in test_sources {
            if source.image_shape() != train.image_shape() {
                return Err(Error::Shape(format!(
                    "training images are {:?} but test images ({}) are {:?}",
                    train.image_shape(),
                    source.describe(),
                    source.image_shape()
                )));
            }
        }
        if test.sets().is_empty() {
            return Err(Error::invalid("test", "the test protocol has no test set"));
        }
        let loss = make_loss(
            &config,
            &LossContext {
                train_labels: train.labels(),
                dim: model.dim(),
                seed: config.seed,
                device: &device,
            },
        )?;
        let mut groups = vec![
            ParamGroup {
                name: BACKBONE_GROUP.into(),
                algorithm: config.optimizer.backbone.algorithm,
                lr: config.optimizer.backbone.lr,
                params: params.trainable(BACKBONE_PREFIX),
            },
            ParamGroup {
                name: HEAD_GROUP.into(),
                algorithm: config.optimizer.head.algorithm,
                lr: config.optimizer.head.lr,
                params: params.trainable(HEAD_PREFIX),
            },
        ];
        let loss_vars = loss.trainable_vars();
        if !loss_vars.is_empty() {
            groups.push(ParamGroup {
                name: LOSS_GROUP.into(),
                algorithm: config.optimizer.loss.algorithm,
                lr: config.optimizer.loss.lr,
                params: loss_vars,
            });
        }
        let optimizer = Optimizer::new(groups)?;
        let sampler = config.sampler.build(train.labels(), config.seed)?;
        let mut trainer = Trainer {
            sampler_state: SamplerState {
                seed: config.seed,
                epoch: 0,
            },
            config,
            device,
            params,
            model,
            optimizer,
            sampler,
            loss,
            loss_from_config,
            train,
            test,
            validation,
            global_step: 0,
            log: MetricsLog::default(),
            kept: None,
        };
        if let Some(path) = trainer.config.resume.clone() {
            trainer.resume(&path)?;
        }
        Ok(trainer)
    }

    /// The variables of the model.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The model.
    pub fn model(&self) -> &EmbeddingNet {
        &self.model
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// The configuration the trainer runs.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The metrics log so far.
    pub fn log(&self) -> &MetricsLog {
        &self.log
    }

    /// Number of epochs completed.
    pub fn epochs_done(&self) -> u64 {
        self.sampler_state.epoch
    }

    /// Number of optimizer steps completed.
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// The training images.
    pub fn train_set(&self) -> &dyn ImageSource {
        self.train.as_ref()
    }

    /// The queries of the first test set (the only one for SOP, iNaturalist, CUB, Cars196 and
    /// the embedded dataset; In-Shop's queries; VehicleID's first size; DyML's first scale).
    pub fn test_set(&self) -> &dyn ImageSource {
        self.test.sets()[0].queries.as_ref()
    }

    /// The test protocol.
    pub fn test_protocol(&self) -> &TestProtocol {
        &self.test
    }

    /// The device of the model.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The loss being trained.
    pub fn loss(&self) -> &dyn RankLoss {
        self.loss.as_ref()
    }

    /// Names of the optimizer's parameter groups.
    fn group_names(&self) -> Vec<String> {
        self.optimizer
            .group_names()
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// Sets every group's learning rate for schedule tick `tick`.
    fn apply_schedule(&mut self, tick: u64) -> Result<()> {
        for group in self.group_names() {
            let group = group.as_str();
            let base = self
                .optimizer
                .base_lr(group)
                .ok_or_else(|| Error::invalid("group", format!("no group `{group}`")))?;
            let lr = self.config.schedule.lr(base, tick);
            self.optimizer.set_lr(group, lr)?;
        }
        Ok(())
    }

    /// Trains one epoch (the next one of the sampler state).
    pub fn train_epoch(&mut self) -> Result<EpochSummary> {
        let epoch = self.sampler_state.epoch;
        let batches = self.sampler_state.batches(self.sampler.as_ref())?;
        if batches.is_empty() {
            return Err(Error::invalid(
                "sampler",
                format!("epoch {} has no batch", epoch + 1),
            ));
        }
        let warmup = BackboneWarmup {
            epochs: self.config.backbone_warmup_epochs,
        };
        let frozen = warmup.backbone_frozen(epoch);
        self.optimizer.set_enabled(BACKBONE_GROUP, !frozen)?;
        let unit = self.config.schedule.unit;
        if unit == ScheduleUnit::Epoch {
            self.apply_schedule(warmup.epoch_ticks(epoch))?;
        }
        let total: usize = batches.iter().map(Vec::len).sum();
        let num_batches = batches.len();
        let pb = Progress::new(
            total,
            "images",
            &format!("epoch {}", epoch + 1),
            self.config.progress,
        );
        let start = Instant::now();
        let mut loss_sum = 0.0;
        // The stream decodes the next batches while this one trains (on-disk data); it borrows
        // a handle on the source, not the trainer, which the loop updates.
        let source = Arc::clone(&self.train);
        let stream = source.stream(batches, View::Train { epoch }, &self.device)?;
        for loaded in stream {
            let loaded = loaded?;
            let batch = &loaded.indices;
            if unit == ScheduleUnit::Iteration {
                self.apply_schedule(self.global_step)?;
            }
            let x = loaded.images;
            let labels = self.train.labels().select(batch)?;
            let model = &self.model;
            let forward = |x: &Tensor| model.forward_t(x, true);
            let (loss, grads) = match self.config.large_batch_chunk {
                Some(chunk) if chunk < batch.len() => {
                    chunked_gradients(&forward, &x, &labels, self.loss.as_ref(), chunk)?
                }
                _ => direct_gradients(&forward, &x, &labels, self.loss.as_ref())?,
            };
            if !loss.is_finite() {
                return Err(Error::invalid(
                    "loss",
                    format!(
                        "the loss is {loss} at epoch {}, step {}",
                        epoch + 1,
                        self.global_step + 1
                    ),
                ));
            }
            self.optimizer.step(&grads)?;
            self.global_step += 1;
            loss_sum += loss;
            self.log
                .push(epoch + 1, self.global_step, "train", "loss", None, loss);
            pb.inc(batch.len() as u64);
            pb.set_message(format!("epoch {} loss {loss:.4}", epoch + 1));
        }
        let seconds = start.elapsed().as_secs_f64();
        pb.finish();
        let summary = EpochSummary {
            epoch: epoch + 1,
            mean_loss: loss_sum / num_batches as f64,
            images_per_s: total as f64 / seconds.max(1e-9),
            batches: num_batches,
            backbone_frozen: frozen,
        };
        let step = self.global_step;
        let e = epoch + 1;
        self.log
            .push(e, step, "train", "loss_mean", None, summary.mean_loss);
        self.log
            .push(e, step, "train", "images_per_s", None, summary.images_per_s);
        self.log
            .push(e, step, "train", "epoch_seconds", None, seconds);
        for group in self.group_names() {
            let group = group.as_str();
            let lr = self.optimizer.lr(group).unwrap_or(f64::NAN);
            self.log
                .push(e, step, "train", &format!("lr/{group}"), None, lr);
        }
        self.sampler_state = self.sampler_state.next();
        Ok(summary)
    }

    /// Embeddings (`N × D`, on the training device) of every image of `source` in evaluation
    /// mode (its evaluation transform, BatchNorm running statistics),
    /// `config.eval.batch_size` images at a time.
    pub fn embed(&self, source: &dyn ImageSource) -> Result<Tensor> {
        let n = source.len();
        let bs = self.config.eval.batch_size;
        let batches: Vec<Vec<usize>> = (0..n)
            .step_by(bs)
            .map(|start| (start..(start + bs).min(n)).collect())
            .collect();
        let what = format!("embedding {}", source.describe());
        let pb = Progress::new(n, "images", &what, self.config.progress);
        let mut parts = Vec::with_capacity(batches.len());
        for batch in source.stream(batches, View::Eval, &self.device)? {
            let batch = batch?;
            parts.push(self.model.forward_t(&batch.images, false)?.detach());
            pb.inc(batch.indices.len() as u64);
        }
        pb.finish();
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// The images of `split`: `train` (the training images, evaluation transform; without the
    /// held-out classes of a `[validation]` table, which are `val`), `test` (the
    /// first test set when its queries are ranked against each other), `query` / `gallery` (the
    /// first test set's queries and gallery, when it has a separate gallery). Errors name the
    /// split and say which ones the dataset has: `query` on a set without a gallery is an error,
    /// not silently the test set.
    pub fn split_source(&self, split: &str) -> Result<Arc<dyn ImageSource>> {
        let first = &self.test.sets()[0];
        let has_gallery = first.gallery.is_some();
        let val = if self.validation.is_some() {
            ", val"
        } else {
            " (val: with a [validation] table)"
        };
        let available = if has_gallery {
            format!("train, query, gallery{val}")
        } else {
            format!(
                "train, test (its images are ranked against each other: there is no separate \
                 query set or gallery){val}"
            )
        };
        match split {
            "train" => Ok(Arc::clone(&self.train)),
            VALIDATION_SPLIT if self.validation.is_some() => {
                Ok(Arc::clone(self.validation.as_ref().expect("checked")))
            }
            "test" if !has_gallery => Ok(Arc::clone(&first.queries)),
            "query" if has_gallery => Ok(Arc::clone(&first.queries)),
            "gallery" if has_gallery => Ok(Arc::clone(first.gallery.as_ref().expect("checked"))),
            other => Err(Error::invalid(
                "split",
                format!(
                    "`{other}` is not a split of this dataset's test protocol (`{}`); use one \
                     of: {available}",
                    first.split
                ),
            )),
        }
    }

    /// Embeddings (`N × D`, on the CPU) and labels of every image of `split`
    /// ([`Trainer::split_source`]), in evaluation mode.
    pub fn embed_split(&self, split: &str) -> Result<(Tensor, crate::hierarchy::Labels)> {
        let source = self.split_source(split)?;
        let embeddings = self.embed(source.as_ref())?.to_device(&Device::Cpu)?;
        Ok((embeddings, source.labels().clone()))
    }

    /// Retrieval evaluation on the dataset's test protocol ([`TestProtocol`]), logged at the
    /// current epoch under each test set's split (`test` for a single set).
    pub fn evaluate(&mut self) -> Result<Evaluation> {
        let opts = EvalOptions {
            recall_ks: self.config.eval.recall_ks.clone(),
            device: self.device.clone(),
            progress: self.config.progress,
            ..EvalOptions::default()
        };
        let (e, s) = (self.sampler_state.epoch, self.global_step);
        let mut out = Evaluation {
            reports: Vec::new(),
            dyml: None,
            validation: None,
        };
        if let Some(val) = self.validation.clone() {
            out.validation = Some(self.evaluate_validation(val.as_ref(), &opts)?);
        }
        match self.test.clone() {
            TestProtocol::Separate(sets) => {
                for (i, set) in sets.into_iter().enumerate() {
                    let embedded = TestEmbeddings {
                        queries: self.embed(set.queries.as_ref())?,
                        query_labels: set.queries.labels().clone(),
                        gallery: match &set.gallery {
                            None => None,
                            Some(g) => Some((self.embed(g.as_ref())?, g.labels().clone())),
                        },
                    };
                    let report = embedded.evaluate(&opts)?;
                    for row in &report.rows {
                        self.log
                            .push(e, s, &set.split, &row.metric, row.level, row.value);
                    }
                    out.reports.push((set.split, report));
                    if let (0, Some(kept)) = (i, self.kept.as_mut()) {
                        kept.latest = Some(TestEmbeddings {
                            queries: embedded.queries.to_device(&Device::Cpu)?,
                            gallery: match embedded.gallery {
                                Some((g, l)) => Some((g.to_device(&Device::Cpu)?, l)),
                                None => None,
                            },
                            ..embedded
                        });
                    }
                }
            }
            TestProtocol::DymlScales(sets) => {
                let mut embedded = Vec::with_capacity(sets.len());
                for set in &sets {
                    let gallery = set.gallery.as_ref().ok_or_else(|| {
                        Error::invalid("test", format!("DyML scale `{}` has no gallery", set.split))
                    })?;
                    embedded.push((
                        self.embed(set.queries.as_ref())?,
                        self.embed(gallery.as_ref())?,
                    ));
                }
                let scales: Vec<DymlScale<'_>> = sets
                    .iter()
                    .zip(&embedded)
                    .map(|(set, (q, g))| DymlScale {
                        name: set.split.clone(),
                        queries: q,
                        query_labels: set.queries.labels(),
                        gallery: g,
                        gallery_labels: set.gallery.as_ref().expect("checked above").labels(),
                    })
                    .collect();
                let result = evaluate_dyml(&scales, &opts)?;
                for r in &result.scales {
                    self.log.push(e, s, &r.name, "mAP", Some(0), r.map);
                    self.log.push(e, s, &r.name, "ASI", None, r.asi);
                    self.log.push(e, s, &r.name, "R@1", Some(0), r.recall_at_1);
                }
                // The averages over the scales (HAPPIER Table 2), not tied to a label column.
                self.log.push(e, s, "test", "mAP", None, result.map);
                self.log.push(e, s, "test", "ASI", None, result.asi);
                self.log.push(e, s, "test", "R@1", None, result.recall_at_1);
                out.dyml = Some(result);
            }
        }
        Ok(out)
    }

    /// The held-out classes' evaluation (each image a query against the others), logged under
    /// `val`. Errors, naming `validation.metric`, when it does not measure the selecting metric.
    fn evaluate_validation(
        &mut self,
        val: &dyn ImageSource,
        opts: &EvalOptions,
    ) -> Result<EvalReport> {
        let embeddings = self.embed(val)?;
        let report = evaluate(&embeddings, val.labels(), None, opts)?;
        let (e, s) = (self.sampler_state.epoch, self.global_step);
        for row in &report.rows {
            self.log
                .push(e, s, VALIDATION_SPLIT, &row.metric, row.level, row.value);
        }
        let (metric, level) = self
            .selecting_metric()?
            .expect("a validation set has a config");
        if report.get(&metric, level).is_none() {
            let measured: Vec<String> = report
                .rows
                .iter()
                .map(|r| match r.level {
                    Some(l) => format!("{}:{l}", r.metric),
                    None => r.metric.clone(),
                })
                .collect();
            return Err(Error::invalid(
                "validation.metric",
                format!(
                    "`{}` is not measured on the held-out classes; they measure {}",
                    self.config.validation.as_ref().expect("checked").metric,
                    measured.join(", ")
                ),
            ));
        }
        Ok(report)
    }

    /// `(metric, level)` that selects the epoch, with a `[validation]` table.
    fn selecting_metric(&self) -> Result<Option<(String, Option<usize>)>> {
        self.config
            .validation
            .as_ref()
            .map(|v| v.metric())
            .transpose()
    }

    /// Whether early stopping ends the run now: a `[validation]` table with `patience`, and that
    /// many evaluations since the selected one ([`validation::patience_spent`]).
    pub fn stops_early(&self) -> Result<bool> {
        Ok(match (self.selecting_metric()?, self.patience()) {
            (Some((metric, level)), Some(p)) => {
                validation::patience_spent(self.log.rows(), &metric, level, p)
            }
            _ => false,
        })
    }

    /// `[validation] patience`, if any.
    fn patience(&self) -> Option<u64> {
        self.config.validation.as_ref().and_then(|v| v.patience)
    }

    /// The epoch with the best validation value so far and its test metrics
    /// ([`validation::select`] over the run's log, epochs before a resume included); `None`
    /// without a `[validation]` table or before the first evaluation.
    pub fn selection(&self) -> Result<Option<Selection>> {
        Ok(self
            .selecting_metric()?
            .and_then(|(metric, level)| validation::select(self.log.rows(), &metric, level)))
    }

    /// Saves a checkpoint to `path` atomically.
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let mut tensors: Vec<(String, Tensor)> = self
            .params
            .all()
            .into_iter()
            .map(|(name, var)| (format!("model.{name}"), var.as_tensor().clone()))
            .collect();
        tensors.extend(
            self.loss
                .trainable_vars()
                .into_iter()
                .map(|(name, var)| (format!("loss.{name}"), var.as_tensor().clone())),
        );
        tensors.extend(self.optimizer.state_tensors()?);
        let meta = CheckpointMeta {
            format: CHECKPOINT_FORMAT.into(),
            sampler: self.sampler_state,
            global_step: self.global_step,
            optimizer: self.optimizer.group_states(),
            config: self.config.clone(),
            log: self.log.clone(),
            loss_state: self.loss.state_json()?,
        };
        let json = serde_json::to_string(&meta)
            .map_err(|e| Error::file(path, format!("cannot serialise the checkpoint: {e}")))?;
        checkpoint::save(path, &tensors, &json)
    }

    /// Restores the state saved by [`Trainer::save_checkpoint`]. The checkpoint must come from a
    /// run with the same seed, data, model and sampler (the error names the field that differs);
    /// the number of epochs, evaluation and output settings may change.
    pub fn resume(&mut self, path: &Path) -> Result<()> {
        let (tensors, json) = checkpoint::load(path, &self.device)?;
        let meta: CheckpointMeta = serde_json::from_str(&json)
            .map_err(|e| Error::file(path, format!("invalid checkpoint metadata: {e}")))?;
        if meta.format != CHECKPOINT_FORMAT {
            return Err(Error::file(
                path,
                format!(
                    "checkpoint format `{}`, expected `{CHECKPOINT_FORMAT}`",
                    meta.format
                ),
            ));
        }
        let old = &meta.config;
        let mismatch = |field: &str| {
            Error::file(
                path,
                format!("the checkpoint was trained with another `{field}` than this run"),
            )
        };
        if old.seed != self.config.seed {
            return Err(mismatch("seed"));
        }
        if old.model != self.config.model {
            return Err(mismatch("model"));
        }
        if old.sampler != self.config.sampler {
            return Err(mismatch("sampler"));
        }
        if old.pretrain != self.config.pretrain {
            return Err(mismatch("pretrain"));
        }
        // The patience may change on resume, as the epochs may; the held-out classes and the
        // selecting metric may not.
        let held_out =
            |v: &Option<ValidationConfig>| v.as_ref().map(ValidationConfig::held_out_key);
        if held_out(&old.validation) != held_out(&self.config.validation) {
            return Err(mismatch("validation"));
        }
        if old.dataset.identity() != self.config.dataset.identity() {
            return Err(mismatch("dataset"));
        }
        if self.loss_from_config && old.loss != self.config.loss {
            return Err(mismatch("loss"));
        }
        let model_tensors: BTreeMap<String, Tensor> = tensors
            .iter()
            .filter_map(|(k, t)| k.strip_prefix("model.").map(|n| (n.to_string(), t.clone())))
            .collect();
        self.params.assign_all(&model_tensors, path)?;
        for (name, var) in self.loss.trainable_vars() {
            let key = format!("loss.{name}");
            let t = tensors
                .get(&key)
                .ok_or_else(|| Error::file(path, format!("missing tensor `{key}` of the loss")))?;
            crate::models::params::assign(&var, t, &key, path)?;
        }
        match &meta.loss_state {
            Some(state) => self
                .loss
                .load_state_json(state)
                .map_err(|e| Error::file(path, e.to_string()))?,
            None => {
                if self.loss.state_json()?.is_some() {
                    return Err(Error::file(
                        path,
                        "the loss keeps state (e.g. RaMBO's score memory) but the checkpoint has none",
                    ));
                }
            }
        }
        self.optimizer.load_state(&meta.optimizer, &tensors, path)?;
        self.sampler_state = meta.sampler;
        self.global_step = meta.global_step;
        self.log = meta.log;
        Ok(())
    }

    /// Trains until `config.epochs` epochs are done, evaluating and writing the outputs as
    /// configured.
    pub fn fit(&mut self) -> Result<TrainReport> {
        let mut last_eval = None;
        let mut epochs = Vec::new();
        let out_dir = self.config.output.dir.clone();
        if let Some(dir) = &out_dir {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let evaluated_at_start = self
            .log
            .rows()
            .iter()
            .any(|r| r.split.starts_with("test") && r.epoch == 0);
        if self.config.eval.at_start && self.sampler_state.epoch == 0 && !evaluated_at_start {
            last_eval = Some(self.evaluate()?);
            self.keep_if_best(out_dir.as_deref())?;
        }
        let total = self.config.epochs;
        let started = Instant::now();
        let first = self.sampler_state.epoch;
        // A run resumed after it stopped early stays stopped.
        let mut stopped = self.stops_early()?;
        while self.sampler_state.epoch < total && !stopped {
            let epoch_started = Instant::now();
            let summary = self.train_epoch()?;
            let done = self.sampler_state.epoch;
            if is_due(done, self.config.eval.every, total) {
                last_eval = Some(self.evaluate()?);
                self.keep_if_best(out_dir.as_deref())?;
                stopped = self.stops_early()?;
            }
            if let Some(dir) = &out_dir {
                // The last epoch's checkpoint is written when the run stops early too, so that a
                // resume finds it stopped rather than an epoch behind.
                if stopped || is_due(done, self.config.output.checkpoint_every, total) {
                    self.save_checkpoint(&dir.join(CHECKPOINT_FILE))?;
                }
                self.write_metrics(dir)?;
            }
            if self.config.progress {
                // Every epoch, on a terminal or in a log: the mean time of this session's epochs
                // (evaluations and checkpoints included) gives the ETA.
                let per_epoch = started.elapsed().as_secs_f64() / (done - first) as f64;
                eprintln!(
                    "{}",
                    epoch_line(
                        &summary,
                        total,
                        &self.log,
                        epoch_started.elapsed().as_secs_f64(),
                        per_epoch * (total - done) as f64
                    )
                );
            }
            epochs.push(summary);
        }
        if stopped && self.config.progress {
            if let Some(s) = self.selection()? {
                eprintln!(
                    "stopped early after epoch {}: no better validation {} than epoch {}'s {:.4} \
                     in {} evaluation(s)",
                    self.sampler_state.epoch,
                    s.metric,
                    s.epoch,
                    s.value,
                    self.patience().unwrap_or(0)
                );
            }
        }
        Ok(TrainReport {
            log: self.log.clone(),
            last_eval,
            epochs,
            selection: self.selection()?,
        })
    }

    /// After an evaluation: with a `[validation]` table, when this evaluation is the selected
    /// one (a new best validation value; a tie keeps the earlier epoch's), keeps its test
    /// embeddings if asked ([`Trainer::keep_selected_test_embeddings`]) and, with an output
    /// folder, writes the network as `best.safetensors`.
    fn keep_if_best(&mut self, out_dir: Option<&Path>) -> Result<()> {
        let latest = self.kept.as_mut().and_then(|k| k.latest.take());
        let Some(best) = self.selection()? else {
            return Ok(());
        };
        if best.epoch != self.sampler_state.epoch {
            return Ok(());
        }
        if let (Some(kept), Some(latest)) = (self.kept.as_mut(), latest) {
            kept.selected = Some((best.epoch, latest));
        }
        if let Some(dir) = out_dir {
            self.save_checkpoint(&dir.join(BEST_CHECKPOINT_FILE))?;
        }
        Ok(())
    }

    /// Asks the run to keep the first test set's embeddings (on the CPU) of the evaluation its
    /// validation selects, for [`Trainer::selected_test_embeddings`]: what an ensemble of the
    /// fold models of a cross-validation is made of ([`crate::retrieval::ensemble`]). Costs one
    /// more copy of the test embeddings in memory, no extra pass. Errors without a `[validation]`
    /// table (nothing selects an epoch) and on DyML's protocol (its scales are averaged, not one
    /// test set).
    pub fn keep_selected_test_embeddings(&mut self) -> Result<()> {
        if self.config.validation.is_none() {
            return Err(Error::invalid(
                "validation",
                "keeping the selected epoch's test embeddings needs a [validation] table to \
                 select the epoch",
            ));
        }
        if matches!(self.test, TestProtocol::DymlScales(_)) {
            return Err(Error::invalid(
                "test",
                "DyML's protocol averages its scales: there is no single test set whose \
                 embeddings to keep",
            ));
        }
        self.kept.get_or_insert_with(KeptTest::default);
        Ok(())
    }

    /// The first test set's embeddings by the network of the evaluation the validation selected,
    /// and its epoch, once [`Trainer::keep_selected_test_embeddings`] was asked before that
    /// evaluation; `None` otherwise (not asked, no evaluation yet, or the selected evaluation
    /// came before a resume).
    pub fn selected_test_embeddings(&self) -> Option<(u64, &TestEmbeddings)> {
        self.kept
            .as_ref()
            .and_then(|k| k.selected.as_ref())
            .map(|(e, t)| (*e, t))
    }

    /// Writes `metrics.csv` and `metrics.parquet` into `dir`.
    pub fn write_metrics(&self, dir: &Path) -> Result<()> {
        self.log.write_csv(&dir.join(METRICS_CSV))?;
        self.log.write_parquet(&dir.join(METRICS_PARQUET))
    }

    /// The checkpoint path of the configured output folder, if any.
    pub fn checkpoint_path(&self) -> Option<PathBuf> {
        self.config
            .output
            .dir
            .as_ref()
            .map(|d| d.join(CHECKPOINT_FILE))
    }
}

/// Trains the recipe of a [`TrainConfig::pretrain`] stage on `data` to its last epoch (no
/// evaluation: only its network is kept) and returns every variable of its network by name.
fn pretrain(stage: TrainConfig, data: &RunData) -> Result<BTreeMap<String, Tensor>> {
    let mut trainer = Trainer::from_config_with_run_data(stage, data.clone())?;
    let total = trainer.config.epochs;
    while trainer.sampler_state.epoch < total {
        let summary = trainer.train_epoch()?;
        if trainer.config.progress {
            eprintln!(
                "pretrain stage: epoch {}/{total}, loss {:.4}",
                summary.epoch, summary.mean_loss
            );
        }
    }
    Ok(trainer
        .params
        .all()
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().clone()))
        .collect())
}

/// The line printed after each epoch: `epoch 3/5: loss 0.4123, test R@1 0.1745 mAP@R 0.0612,
/// 2470 images/s, 25.9 s, ETA 52 s` (the evaluation's fine-level R@1 and mAP@R of every split
/// evaluated at this epoch, if any).
fn epoch_line(
    summary: &EpochSummary,
    total: u64,
    log: &MetricsLog,
    seconds: f64,
    eta: f64,
) -> String {
    let mut metrics = String::new();
    let mut splits: Vec<&str> = Vec::new();
    for r in log.rows() {
        if r.epoch == summary.epoch && r.split != "train" && !splits.contains(&r.split.as_str()) {
            splits.push(&r.split);
        }
    }
    for split in splits {
        metrics.push_str(&format!(", {split}"));
        for name in ["R@1", "mAP@R"] {
            let value = log.rows().iter().find(|r| {
                r.epoch == summary.epoch
                    && r.split == split
                    && r.metric == name
                    && r.level == Some(0)
            });
            if let Some(r) = value {
                metrics.push_str(&format!(" {name} {:.4}", r.value));
            }
        }
    }
    format!(
        "epoch {}/{total}: loss {:.4}{metrics}, {:.0} images/s, {}, ETA {}",
        summary.epoch,
        summary.mean_loss,
        summary.images_per_s,
        crate::progress::seconds(seconds),
        crate::progress::seconds(eta)
    )
}

/// Whether a periodic action with period `every` is due after `done` of `total` epochs (always
/// after the last; `every = 0` means only then).
fn is_due(done: u64, every: u64, total: u64) -> bool {
    done == total || (every > 0 && done.is_multiple_of(every))
}

/// Builds a [`Trainer`] from `config` (its data: [`load_data`]) with the given loss and trains
/// it to the end.
pub fn run(config: &TrainConfig, loss: &dyn RankLoss) -> Result<TrainReport> {
    Trainer::new(config.clone(), loss)?.fit()
}

/// Builds a [`Trainer`] from `config`, loss included, and trains it to the end: the library
/// entry point of `rankwise train --config`.
pub fn run_config(config: &TrainConfig) -> Result<TrainReport> {
    Trainer::from_config(config.clone())?.fit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_line_names_loss_metrics_speed_and_eta() {
        let mut log = MetricsLog::default();
        log.push(2, 8, "test", "R@1", Some(0), 0.17451);
        log.push(2, 8, "test", "R@1", Some(1), 0.9);
        log.push(2, 8, "test", "mAP@R", Some(0), 0.0612);
        log.push(1, 4, "test", "R@1", Some(0), 0.1);
        let summary = EpochSummary {
            epoch: 2,
            mean_loss: 0.41234,
            images_per_s: 2470.4,
            batches: 4,
            backbone_frozen: false,
        };
        assert_eq!(
            epoch_line(&summary, 5, &log, 25.9, 185.0),
            "epoch 2/5: loss 0.4123, test R@1 0.1745 mAP@R 0.0612, 2470 images/s, 26 s, ETA 3 \
             min 05 s"
        );
        let summary = EpochSummary {
            epoch: 3,
            ..summary
        };
        assert_eq!(
            epoch_line(&summary, 5, &log, 1.0, 2.0),
            "epoch 3/5: loss 0.4123, 2470 images/s, 1 s, ETA 2 s"
        );
    }

    #[test]
    fn periodic_actions() {
        assert!(is_due(3, 0, 3));
        assert!(!is_due(2, 0, 3));
        assert!(is_due(2, 2, 5));
        assert!(!is_due(3, 2, 5));
        assert!(is_due(5, 2, 5));
    }
}

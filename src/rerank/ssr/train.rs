//! Meta-training SSR (Sec. 2.4 and Sec. 3): one graph per iteration (batch size 1), SGD with
//! momentum 0.9 ([`crate::train::optim`]), and the paper's staged schedule — few-shot: `T = 1`
//! for 30k iterations at LR 0.1 dropped to 0.01 after 5k, then `T = 2` and `T = 3` for 10k
//! each at 0.01; retrieval: `T = 1`, 10k iterations at a fixed LR.
//!
//! Training graphs come from the frozen features of the *training* classes:
//! [`RetrievalTasks`] draws a query and ranks a pool of random images (the code's 1,000) to
//! its top k, keeping only hard lists (initial AP below a threshold, enough positives — the
//! code's filter); [`FewShotTasks`] draws episodes.

use super::graph::Task;
use super::model::SsrModel;
use super::SupportNodes;
use crate::error::{Error, Result};
use crate::fewshot::EpisodeFeatures;
use crate::hierarchy::Labels;
use crate::samplers::episodes::{EpisodeConfig, EpisodeSampler};
use crate::train::optim::{Algorithm, Optimizer, ParamGroup, SgdConfig};
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One stage of the schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Number of updates `T` during this stage.
    pub steps: usize,
    /// Iterations (graphs).
    pub iterations: usize,
    /// Learning rate.
    pub lr: f64,
    /// Iteration (within the stage) after which the LR is multiplied by `lr_factor`.
    #[serde(default)]
    pub lr_drop_at: Option<usize>,
    /// The factor of the drop (the paper's 0.1).
    #[serde(default = "tenth")]
    pub lr_factor: f64,
}

fn tenth() -> f64 {
    0.1
}

/// The optimiser and schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaTrainConfig {
    /// The stages, in order.
    pub stages: Vec<Stage>,
    /// SGD momentum (paper: 0.9).
    #[serde(default = "momentum")]
    pub momentum: f64,
    /// Nesterov momentum (the few-shot code; the paper says SGD with momentum).
    #[serde(default)]
    pub nesterov: bool,
    /// L2 weight decay (the code: 5e-4; the paper does not say).
    #[serde(default)]
    pub weight_decay: f64,
}

fn momentum() -> f64 {
    0.9
}

impl MetaTrainConfig {
    /// The paper's few-shot schedule (Sec. 3.2).
    pub fn paper_few_shot() -> Self {
        MetaTrainConfig {
            stages: vec![
                Stage {
                    steps: 1,
                    iterations: 30_000,
                    lr: 0.1,
                    lr_drop_at: Some(5_000),
                    lr_factor: 0.1,
                },
                Stage {
                    steps: 2,
                    iterations: 10_000,
                    lr: 0.01,
                    lr_drop_at: None,
                    lr_factor: 0.1,
                },
                Stage {
                    steps: 3,
                    iterations: 10_000,
                    lr: 0.01,
                    lr_drop_at: None,
                    lr_factor: 0.1,
                },
            ],
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// Errors naming the first invalid field.
    pub fn validate(&self) -> Result<()> {
        if self.stages.is_empty() {
            return Err(Error::invalid("stages", "list at least one stage"));
        }
        for (i, s) in self.stages.iter().enumerate() {
            if s.steps == 0 || s.iterations == 0 || !(s.lr.is_finite() && s.lr > 0.0) {
                return Err(Error::invalid(
                    format!("stages[{i}]"),
                    "steps and iterations must be ≥ 1 and lr finite and > 0",
                ));
            }
        }
        Algorithm::Sgd(self.sgd()).validate()
    }

    fn sgd(&self) -> SgdConfig {
        SgdConfig {
            momentum: self.momentum,
            dampening: 0.0,
            nesterov: self.nesterov,
            weight_decay: self.weight_decay,
        }
    }
}

/// A source of training graphs: the loss of `model` on graph number `i`.
pub trait TaskSource {
    /// The meta-loss of graph `i` (after the model's `T` updates).
    fn loss(&self, model: &SsrModel, i: u64) -> Result<Tensor>;
}

/// Trains `model` on graphs `first..` of `tasks` through one stage (sets the model's `T`).
/// Returns the loss of every iteration.
pub fn train_stage(
    model: &mut SsrModel,
    tasks: &dyn TaskSource,
    stage: &Stage,
    config: &MetaTrainConfig,
    first: u64,
) -> Result<Vec<f64>> {
    config.validate()?;
    model.config.steps = stage.steps;
    let mut opt = Optimizer::new(vec![ParamGroup {
        name: "ssr".into(),
        algorithm: Algorithm::Sgd(config.sgd()),
        lr: stage.lr,
        params: model.vars(),
    }])?;
    let mut losses = Vec::with_capacity(stage.iterations);
    for it in 0..stage.iterations {
        if stage.lr_drop_at == Some(it) {
            opt.set_lr("ssr", stage.lr * stage.lr_factor)?;
        }
        let loss = tasks.loss(model, first + it as u64)?;
        let v = loss.to_dtype(DType::F64)?.to_vec0::<f64>()?;
        if !v.is_finite() {
            return Err(Error::invalid(
                "loss",
                format!("the meta-loss became {v} at iteration {it}; lower the learning rate or λ"),
            ));
        }
        losses.push(v);
        let grads = loss.backward()?;
        opt.step(&grads)?;
    }
    Ok(losses)
}

/// Trains through every stage; returns the loss of every iteration.
pub fn meta_train(
    model: &mut SsrModel,
    tasks: &dyn TaskSource,
    config: &MetaTrainConfig,
) -> Result<Vec<f64>> {
    let mut all = Vec::new();
    for stage in &config.stages {
        let first = all.len() as u64;
        all.extend(train_stage(model, tasks, stage, config, first)?);
    }
    Ok(all)
}

/// Rows of a matrix as f32, checked finite.
fn rows_f32(features: &Tensor) -> Result<(Vec<f32>, usize)> {
    let dims = features.dims();
    if dims.len() != 2 {
        return Err(Error::Shape(format!(
            "features must be a matrix, got {dims:?}"
        )));
    }
    let v = features
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    if let Some(p) = v.iter().position(|x| !x.is_finite()) {
        return Err(Error::invalid(
            "features",
            format!("row {} contains NaN or infinity", p / dims[1].max(1)),
        ));
    }
    Ok((v, dims[1]))
}

/// Retrieval training graphs (the code's `sample_train_sequence`).
pub struct RetrievalTasks {
    unit: Vec<f32>,
    dim: usize,
    labels: Vec<crate::hierarchy::ClassId>,
    /// References per graph.
    pub k: usize,
    /// Random images ranked per query (`None`: all).
    pub pool: Option<usize>,
    /// Keep a list only if it has at least this many positives (code: more than 5).
    pub min_positives: usize,
    /// Keep a list only if its AP is below this (code: 0.8).
    pub max_ap: f64,
    seed: u64,
}

impl RetrievalTasks {
    /// Graphs over `features` (`N × d`) with fine labels `labels`; errors on bad features,
    /// mismatched labels or `k ≥ N`.
    pub fn new(features: &Tensor, labels: &Labels, k: usize, seed: u64) -> Result<Self> {
        let (v, dim) = rows_f32(features)?;
        let n = labels.len();
        if v.len() != n * dim {
            return Err(Error::Shape(format!(
                "{} feature rows for {n} labels",
                v.len() / dim.max(1)
            )));
        }
        if k == 0 || k >= n {
            return Err(Error::invalid(
                "k",
                format!(
                    "must be between 1 and {} (the images less the query), got {k}",
                    n.saturating_sub(1)
                ),
            ));
        }
        let unit: Vec<f32> = v
            .chunks(dim)
            .flat_map(|r| {
                let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                r.iter().map(move |x| x / norm).collect::<Vec<_>>()
            })
            .collect();
        Ok(RetrievalTasks {
            unit,
            dim,
            labels: (0..n).map(|i| labels.fine(i)).collect(),
            k,
            pool: None,
            min_positives: 1,
            max_ap: 1.0,
            seed,
        })
    }

    /// The query, its top-k references (by cosine over the pool) and their positive flags
    /// for graph `i`, after the hard-example filter (up to 1,000 draws; the last one is used
    /// if none passes).
    pub fn sample(&self, i: u64) -> (usize, Vec<usize>, Vec<bool>) {
        let n = self.labels.len();
        let mut rng = StdRng::seed_from_u64(self.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut last = None;
        for _ in 0..1000 {
            let q = rng.random_range(0..n);
            let pool: Vec<usize> = match self.pool {
                Some(p) if p < n - 1 => {
                    let mut idx = rand::seq::index::sample(&mut rng, n - 1, p).into_vec();
                    for x in idx.iter_mut() {
                        if *x >= q {
                            *x += 1;
                        }
                    }
                    idx
                }
                _ => (0..n).filter(|&j| j != q).collect(),
            };
            let k = self.k.min(pool.len());
            let qv = &self.unit[q * self.dim..(q + 1) * self.dim];
            let mut scored: Vec<(f32, usize)> = pool
                .iter()
                .map(|&j| {
                    let r = &self.unit[j * self.dim..(j + 1) * self.dim];
                    (qv.iter().zip(r).map(|(a, b)| a * b).sum(), j)
                })
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let top: Vec<usize> = scored[..k].iter().map(|x| x.1).collect();
            let pos: Vec<bool> = top
                .iter()
                .map(|&j| self.labels[j] == self.labels[q])
                .collect();
            let np = pos.iter().filter(|&&p| p).count();
            let ok_mix = np >= self.min_positives.max(1) && np < pos.len();
            let ap = crate::metrics::average_precision(
                &pos.iter().map(|&p| u8::from(p)).collect::<Vec<_>>(),
                1,
            )
            .unwrap_or(0.0);
            if ok_mix && ap < self.max_ap {
                return (q, top, pos);
            }
            if np >= 1 && np < pos.len() {
                last = Some((q, top, pos));
            }
        }
        last.unwrap_or_else(|| (0, Vec::new(), Vec::new()))
    }

    /// The node features of a sampled graph: the query then its references (`(k+1) × d`).
    pub fn node_features(&self, q: usize, refs: &[usize], dtype: DType) -> Result<Tensor> {
        let mut v = Vec::with_capacity((refs.len() + 1) * self.dim);
        for &j in std::iter::once(&q).chain(refs) {
            v.extend_from_slice(&self.unit[j * self.dim..(j + 1) * self.dim]);
        }
        Ok(Tensor::from_vec(v, (refs.len() + 1, self.dim), &Device::Cpu)?.to_dtype(dtype)?)
    }
}

impl TaskSource for RetrievalTasks {
    fn loss(&self, model: &SsrModel, i: u64) -> Result<Tensor> {
        if model.task != (Task::Retrieval { k: self.k }) {
            return Err(Error::invalid(
                "task",
                format!(
                    "the model refines {:?}, the graphs have k = {}",
                    model.task, self.k
                ),
            ));
        }
        let (q, refs, pos) = self.sample(i);
        if refs.is_empty() {
            return Err(Error::invalid(
                "labels",
                "no query has both a positive and a negative among its top k: the training \
                 features cannot train SSR",
            ));
        }
        model.retrieval_loss(&self.node_features(q, &refs, model.dtype)?, &pos)
    }
}

/// Few-shot training graphs: episodes of the training classes.
pub struct FewShotTasks {
    flat: Vec<f32>,
    dim: usize,
    sampler: EpisodeSampler,
    /// Support nodes: prototypes or shots.
    pub support_nodes: SupportNodes,
}

impl FewShotTasks {
    /// Episodes with `config` over `features` (`N × d`) and `labels`.
    pub fn new(
        features: &Tensor,
        labels: &Labels,
        config: &EpisodeConfig,
        support_nodes: SupportNodes,
        seed: u64,
    ) -> Result<Self> {
        let (flat, dim) = rows_f32(features)?;
        if flat.len() != labels.len() * dim {
            return Err(Error::Shape(format!(
                "{} feature rows for {} labels",
                flat.len() / dim.max(1),
                labels.len()
            )));
        }
        Ok(FewShotTasks {
            flat,
            dim,
            sampler: EpisodeSampler::new(labels, config.clone(), seed)?,
            support_nodes,
        })
    }

    /// Episode `i`'s features.
    pub fn episode(&self, i: u64) -> Result<EpisodeFeatures> {
        EpisodeFeatures::from_rows(&self.flat, self.dim, &self.sampler.episode(i))
    }
}

impl TaskSource for FewShotTasks {
    fn loss(&self, model: &SsrModel, i: u64) -> Result<Tensor> {
        let ep = self.episode(i)?;
        let (nodes, support_labels) = super::episode_nodes(&ep, self.support_nodes, model.dtype)?;
        model.few_shot_loss(&nodes, &support_labels, &ep.query_labels)
    }
}

//! Choosing SSR's hyperparameters on validation classes, as the paper does (Sec. 3): one model
//! meta-trained per candidate step size `λ` (and list length `k` for retrieval), scored after
//! each stage of the schedule (so `T` is chosen too), the best kept.

use super::graph::Task;
use super::model::{SsrConfig, SsrModel};
use super::train::{train_stage, MetaTrainConfig, TaskSource};
use crate::error::{Error, Result};
use candle_core::{DType, Tensor};

impl SsrModel {
    /// A copy of every variable, by name (to keep the best model seen so far).
    pub fn snapshot(&self) -> Result<Vec<(String, Tensor)>> {
        self.vars()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().copy()?)))
            .collect()
    }

    /// Sets the variables to a [`SsrModel::snapshot`] of a model of the same configuration;
    /// an error naming the first variable that does not match.
    pub fn restore(&self, snapshot: &[(String, Tensor)]) -> Result<()> {
        let vars = self.vars();
        if vars.len() != snapshot.len() {
            return Err(Error::invalid(
                "snapshot",
                format!("{} variables for a model of {}", snapshot.len(), vars.len()),
            ));
        }
        for ((name, v), (snap_name, t)) in vars.iter().zip(snapshot) {
            if name != snap_name || v.dims() != t.dims() {
                return Err(Error::invalid(
                    "snapshot",
                    format!("`{snap_name}` {:?} for `{name}` {:?}", t.dims(), v.dims()),
                ));
            }
            v.set(t)?;
        }
        Ok(())
    }
}

/// The model kept by the validation selection and what was selected.
#[derive(Debug)]
pub struct Selected {
    /// The selected model (its `λ` and `T` in its configuration).
    pub model: SsrModel,
    /// The selected step size.
    pub lambda: f64,
    /// The selected `k` (retrieval; the candidate's `k` otherwise).
    pub k: usize,
    /// Its validation score.
    pub val_score: f64,
    /// Meta-training iterations up to the selected stage's end.
    pub iterations: usize,
    /// Mean loss of the first (up to) 20 iterations.
    pub first_loss: f64,
    /// Mean loss of the last (up to) 20 iterations before the selection.
    pub last_loss: f64,
}

impl Selected {
    /// The selection in words, for a table's caption (`what`: the validation metric).
    pub fn describe(&self, what: &str) -> String {
        format!(
            "SSR hidden {}, λ = {}, T = {}{} selected on the validation classes ({what} {:.4}); \
             meta-trained {} iterations on the base classes (loss {:.3} → {:.3})",
            self.model.config.hidden,
            self.lambda,
            self.model.config.steps,
            if matches!(self.model.task, Task::Retrieval { .. }) {
                format!(", k = {}", self.k)
            } else {
                String::new()
            },
            self.val_score,
            self.iterations,
            self.first_loss,
            self.last_loss
        )
    }
}

/// Meta-trains one model per `(λ, k)` candidate through the stages of `train` (`make_task(k)`
/// the graphs' size, `make_tasks(k)` the training graphs of the base classes), scores it with
/// `validate` after each stage, and returns the best model, `T` included: the paper's
/// selection of `λ` and `T` (and of `k` for retrieval) on the validation classes. Prints one
/// line per candidate and stage.
pub fn select(
    candidates: &[(f64, usize)],
    base_config: &SsrConfig,
    train: &MetaTrainConfig,
    seed: u64,
    make_task: &dyn Fn(usize) -> Task,
    make_tasks: &dyn Fn(usize) -> Result<Box<dyn TaskSource>>,
    validate: &dyn Fn(&SsrModel) -> Result<f64>,
) -> Result<Selected> {
    // (validation score, λ, k, T, the variables, the task, (iterations, first and last loss)).
    type Best = (
        f64,
        f64,
        usize,
        usize,
        Vec<(String, Tensor)>,
        Task,
        (usize, f64, f64),
    );
    let mut best: Option<Best> = None;
    for &(lambda, k) in candidates {
        let config = SsrConfig {
            lambda,
            ..base_config.clone()
        };
        let mut model = SsrModel::new(config, make_task(k), DType::F32, seed)?;
        let tasks = make_tasks(k)?;
        let mut losses = Vec::new();
        for stage in &train.stages {
            let first = losses.len() as u64;
            losses.extend(train_stage(
                &mut model,
                tasks.as_ref(),
                stage,
                train,
                first,
            )?);
            let score = validate(&model)?;
            println!(
                "  ssr {:?}: λ = {lambda}, T = {}: {} iterations, last loss {:.4}, validation {score:.4}",
                model.task,
                stage.steps,
                losses.len(),
                losses.last().copied().unwrap_or(f64::NAN)
            );
            if best.as_ref().is_none_or(|b| score > b.0) {
                let head = losses.iter().take(20).sum::<f64>() / losses.len().min(20) as f64;
                let tail_n = losses.len().min(20);
                let tail = losses[losses.len() - tail_n..].iter().sum::<f64>() / tail_n as f64;
                best = Some((
                    score,
                    lambda,
                    k,
                    stage.steps,
                    model.snapshot()?,
                    model.task,
                    (losses.len(), head, tail),
                ));
            }
        }
    }
    let (val_score, lambda, k, steps, snap, task, (iterations, first_loss, last_loss)) =
        best.ok_or_else(|| Error::invalid("lambdas", "no candidate to select from"))?;
    let config = SsrConfig {
        lambda,
        steps,
        ..base_config.clone()
    };
    let model = SsrModel::new(config, task, DType::F32, seed)?;
    model.restore(&snap)?;
    Ok(Selected {
        model,
        lambda,
        k,
        val_score,
        iterations,
        first_loss,
        last_loss,
    })
}

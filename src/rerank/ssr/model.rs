//! SSR's network (Sec. 2.4) and its configuration: the MLP `g` that maps each subgraph `M_i`
//! to an update signal of the same shape, and the learnable temperature `τ` of the losses
//! (Eqs. 6–7).

use super::graph::{ColumnOrder, Decomposition, Layout, NodeGroup, SubgraphSpec, Task};
use crate::error::{Error, Result};
use crate::models::ParamStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Linear, Module, VarBuilder};
use serde::{Deserialize, Serialize};

/// How the update signal moves the features (where the paper and the authors' code differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateRule {
    /// SSR Eq. 4: `f_i ← f_i + λ Σ_j G_ij ∂s_ij/∂f_i`, only the row-`i` term of each edge.
    #[default]
    Paper,
    /// The authors' code (`refine_feat`), exactly: `f_X ← f_X − λ ∇_{f_X} ⟨inputs, g⟩`, the
    /// gradient of the subgraph inputs against the MLP's output `g` taken by autograd with
    /// `create_graph=True`. Each edge counts `G_ij + G_ji` and the sign is flipped (the MLP
    /// learns the sign). With the alternating schedule the gradient is the *total*
    /// derivative: the other group's latest update is itself a function of `f_X` (the
    /// database update of a step through that step's query update, each later query update
    /// through the previous database update), a term of order `λ` that
    /// [`super::alternating`] computes in closed form. With the joint schedule there is no
    /// such path and this equals [`UpdateRule::AuthorsCodeFirstOrder`].
    AuthorsCode,
    /// The authors' update without the path through the other group's update: the plain
    /// first-order VJP `f_X ← f_X − λ [∂⟨inputs, g⟩/∂f]_X` with the other group's features
    /// held fixed (what autograd would give if each group's update were detached). It differs
    /// from [`UpdateRule::AuthorsCode`] only under the alternating schedule, from the second
    /// update on.
    AuthorsCodeFirstOrder,
}

/// Which nodes an update step moves, with which MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupSchedule {
    /// The paper (Eqs. 4–5): one MLP `g`, every node updated at once from the same `S^{t-1}`.
    #[default]
    Joint,
    /// The authors' code: two MLPs (retrieval: query then database; few-shot: support then
    /// query), the second group updated from the similarities recomputed after the first.
    Alternating,
}

/// The paper's loss of the retrieval variant (Eq. 6) or the code's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetrievalLoss {
    /// SSR Eq. 6: every pair `(i, j)` of distinct nodes of the query's class, negatives `k` of
    /// another class, averaged over the pairs (the paper sums; the mean only rescales the
    /// learning rate).
    #[default]
    AllPositivePairs,
    /// The authors' `InfoBCE`: only `i` = the query, averaged over its positives.
    QueryRow,
}

/// What is refined by each update (SSR Table 3–4, "w.o feat. update").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateSpace {
    /// SSR Eqs. 3–4: the update is projected onto the node features (one gradient step of
    /// step size `λ`), so `S^t` stays a cosine-similarity matrix.
    #[default]
    Features,
    /// "w.o feat. update": the unconstrained Eq. 2, the update added directly to the
    /// similarity matrix, `S^t = S^{t−1} + λ G(S^{t−1})`, and the loss taken on `S^T`. The
    /// output is scaled by the same step `λ` as the feature step so that only *where* the
    /// update is applied changes, not its size: the feature step moves an isolated entry by
    /// `Δs_ij ≈ λ G_ij (1 − s_ij²)`. `λ = 1` is Eq. 2 as printed (which, unscaled, made
    /// meta-training diverge at the few-shot LR of 0.1 at our quick scale).
    Similarity,
}

/// What SSR's MLP reads at each update.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SsrInput {
    /// The entries of `S^t` (Sec. 2.2).
    #[default]
    Similarity,
    /// SSR Sec. 2.3: the entries of `D^t = 2α(1 − S^t) + (1 − α)J` (Eq. 9, since
    /// `‖â − b̂‖² = 2(1 − cos)`), with `J` the k-reciprocal Jaccard distance between the graph's
    /// nodes ([`crate::rerank::k_reciprocal`]) computed once from the initial features and
    /// kept fixed (not differentiated). The subgraphs are still sorted by `S^t`, the update
    /// still moves the features (or `S^t`) and the loss stays on `S^T`. The authors' released
    /// code does not do this (it applies SSR to the k-reciprocal list instead).
    KReciprocal {
        /// Weight `α` of the feature distance (Eq. 9), in `[0, 1]`.
        alpha: f64,
        /// Size of the k-reciprocal sets `R(i, k1)` (Eq. 8); `k1 + 1` ≤ the graph's nodes.
        k1: usize,
        /// Neighbours averaged by the local query expansion (1 = none); ≤ the graph's nodes.
        k2: usize,
    },
}

/// SSR's hyperparameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsrConfig {
    /// Hidden width of the 3-layer MLP (Sec. 2.4: 1,024 for retrieval, 4,096 for few-shot).
    pub hidden: usize,
    /// Number of updates `T` (Sec. 2.1).
    pub steps: usize,
    /// Step size `λ` of Eq. 4 (authors' code: 1e-4–5e-4 retrieval, 1e-3–5e-3 few-shot).
    pub lambda: f64,
    /// Subgraph layout.
    pub layout: Layout,
    /// Row groups of `M_i` (SSR Tables 3–4; absent: the paper's — retrieval `["sample",
    /// "query"]`, few-shot `["sample", "support"]`). Table 3: `["query"]` (w.o sample),
    /// `["sample"]` (w.o query), `["sample", "query", "references"]` (w.o other, "the full
    /// graph"); Table 4: `["sample", "support", "query"]`, `["support"]`, `["sample"]`.
    pub rows: Option<Vec<NodeGroup>>,
    /// Column groups of `M_i`, few-shot only (Table 4; absent: `["support", "query"]`, each
    /// block sorted separately): `["support"]` or `["query"]`.
    pub columns: Option<Vec<NodeGroup>>,
    /// Local sort (the paper) or one shared order (Tables 3–4 "w.o local sort").
    pub order: ColumnOrder,
    /// Subgraphs (the paper) or the whole matrix (Tables 3–4 "w.o subgraph").
    pub decomposition: Decomposition,
    /// Features (Eqs. 3–4, the paper) or the similarity matrix (Eq. 2, Tables 3–4 "w.o feat.
    /// update").
    pub update_space: UpdateSpace,
    /// The MLP's input: `S^t` (the paper's default) or Eq. 9's `D^t` (Sec. 2.3).
    pub input: SsrInput,
    /// Feature update.
    pub rule: UpdateRule,
    /// One MLP for every node or two alternating ones.
    pub schedule: GroupSchedule,
    /// Retrieval loss (Eq. 6 or the code's query row).
    pub retrieval_loss: RetrievalLoss,
    /// Initial temperature `τ` (the code's `scale_cls`, 10).
    pub tau_init: f64,
    /// Start from a zero last layer, i.e. from the identity (SSR leaves the features
    /// unchanged until it has learned something). Not in the paper or the code (both use
    /// PyTorch's default initialisation); useful when meta-training for only a few hundred
    /// iterations, as at our CPU scales.
    pub zero_init_output: bool,
    /// L2-normalise the node features before the updates. Off (the authors' code): SSR moves
    /// the features it is given and normalises only to form the similarities, so a node's
    /// step `∂s_ij/∂f_i = (f̂_j − s_ij f̂_i)/‖f_i‖` shrinks as its norm grows. On: every node
    /// starts on the unit sphere, which makes the step independent of the backbone's feature
    /// scale (each node's step is `‖f_i‖²` times the raw one in the similarities it moves),
    /// and the refined features are returned in that normalised space.
    pub normalize_input: bool,
}

impl Default for SsrConfig {
    /// The paper's few-shot choices: hidden 4,096, `T = 3`, `λ = 1e-3`, paper layout, Eq. 4
    /// update, one MLP, Eq. 6 loss, `τ₀ = 10`; the full method of Tables 3–4 (local sort,
    /// subgraphs, feature update, similarity input).
    fn default() -> Self {
        SsrConfig {
            hidden: 4096,
            steps: 3,
            lambda: 1e-3,
            layout: Layout::Paper,
            rows: None,
            columns: None,
            order: ColumnOrder::Local,
            decomposition: Decomposition::Subgraphs,
            update_space: UpdateSpace::Features,
            input: SsrInput::Similarity,
            rule: UpdateRule::Paper,
            schedule: GroupSchedule::Joint,
            retrieval_loss: RetrievalLoss::AllPositivePairs,
            tau_init: 10.0,
            zero_init_output: false,
            normalize_input: false,
        }
    }
}

impl SsrConfig {
    /// Errors naming the first invalid field.
    pub fn validate(&self) -> Result<()> {
        if self.hidden == 0 {
            return Err(Error::invalid("hidden", "must be ≥ 1"));
        }
        if !self.lambda.is_finite() || self.lambda < 0.0 {
            return Err(Error::invalid(
                "lambda",
                format!("must be finite and ≥ 0, got {}", self.lambda),
            ));
        }
        if !self.tau_init.is_finite() || self.tau_init <= 0.0 {
            return Err(Error::invalid(
                "tau_init",
                format!("must be finite and > 0, got {}", self.tau_init),
            ));
        }
        self.subgraph_spec().validate()?;
        if self.update_space == UpdateSpace::Similarity {
            // Both settings only change how the update signal moves the *features*.
            if self.schedule == GroupSchedule::Alternating {
                return Err(Error::invalid(
                    "schedule",
                    "\"alternating\" updates the features of one node group at a time; with \
                     update_space = \"similarity\" there are no features to update: use \"joint\"",
                ));
            }
            if self.rule != UpdateRule::Paper {
                return Err(Error::invalid(
                    "rule",
                    "the rule shapes the feature step; with update_space = \"similarity\" \
                     (Eq. 2) use rule = \"paper\"",
                ));
            }
        }
        if let SsrInput::KReciprocal { alpha, k1, k2 } = self.input {
            if !(0.0..=1.0).contains(&alpha) {
                return Err(Error::invalid(
                    "input.k_reciprocal.alpha",
                    format!("must be in [0, 1], got {alpha}"),
                ));
            }
            if k1 == 0 || k2 == 0 {
                return Err(Error::invalid(
                    "input.k_reciprocal",
                    format!("k1 and k2 must be ≥ 1, got k1 = {k1}, k2 = {k2}"),
                ));
            }
        }
        Ok(())
    }

    /// What the MLP reads of the graph (layout, rows, columns, order, decomposition).
    pub fn subgraph_spec(&self) -> SubgraphSpec {
        SubgraphSpec {
            layout: self.layout,
            rows: self.rows.clone(),
            columns: self.columns.clone(),
            order: self.order,
            decomposition: self.decomposition,
        }
    }

    /// Number of MLPs the schedule needs.
    pub fn num_mlps(&self) -> usize {
        match self.schedule {
            GroupSchedule::Joint => 1,
            GroupSchedule::Alternating => 2,
        }
    }
}

/// `InstanceNorm1d(1, affine=True)` on each row of an `m × D` matrix (the flattened subgraph
/// is one channel): `(x − mean) / √(var + 1e-5) · γ + β`, biased variance as PyTorch.
#[derive(Debug, Clone)]
pub struct InstanceNorm {
    gamma: Tensor,
    beta: Tensor,
}

impl InstanceNorm {
    fn new(vb: VarBuilder) -> Result<Self> {
        Ok(InstanceNorm {
            gamma: vb.get_with_hints(1, "weight", candle_nn::Init::Const(1.0))?,
            beta: vb.get_with_hints(1, "bias", candle_nn::Init::Const(0.0))?,
        })
    }
}

impl InstanceNorm {
    /// The normalised rows `x̂ = (x − mean) / σ` and `σ = √(var + 1e-5)` (`m × 1`).
    fn standardise(x: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let mean = x.mean_keepdim(1)?;
        let xc = x.broadcast_sub(&mean)?;
        let sigma = (xc.sqr()?.mean_keepdim(1)? + 1e-5)?.sqrt()?;
        Ok((xc.broadcast_div(&sigma)?, sigma))
    }

    /// Forward derivative at a point standardised as `(x̂, σ)`:
    /// `dy = γ (dxc − x̂ mean(x̂ ⊙ dxc)) / σ` with `dxc = dx − mean(dx)`; the second term is
    /// the change of `σ` (`dσ = mean(x̂ ⊙ dxc)`, from the biased variance as PyTorch).
    fn jvp(&self, xhat: &Tensor, sigma: &Tensor, dx: &Tensor) -> candle_core::Result<Tensor> {
        let dxc = dx.broadcast_sub(&dx.mean_keepdim(1)?)?;
        let proj = (xhat * &dxc)?.mean_keepdim(1)?;
        (dxc - xhat.broadcast_mul(&proj)?)?
            .broadcast_div(sigma)?
            .broadcast_mul(&self.gamma)
    }

    /// Transposed derivative: `x̄ = (ḡ − mean(ḡ) − x̂ mean(ḡ ⊙ x̂)) / σ` with `ḡ = γ ȳ` (the
    /// Jacobian of a standardisation is symmetric).
    fn vjp(&self, xhat: &Tensor, sigma: &Tensor, gy: &Tensor) -> candle_core::Result<Tensor> {
        let g = gy.broadcast_mul(&self.gamma)?;
        let gc = g.broadcast_sub(&g.mean_keepdim(1)?)?;
        let proj = (&g * xhat)?.mean_keepdim(1)?;
        (gc - xhat.broadcast_mul(&proj)?)?.broadcast_div(sigma)
    }
}

impl Module for InstanceNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (y, _) = Self::standardise(x)?;
        y.broadcast_mul(&self.gamma)?.broadcast_add(&self.beta)
    }
}

/// SSR's MLP `g` (Sec. 2.4; the code's `dni_linear`): InstanceNorm → Linear(D, h) → ReLU →
/// InstanceNorm → Linear(h, h) → ReLU → InstanceNorm → Linear(h, D). Input and output are
/// `m × D`: one flattened subgraph `M_i` per row, one update per entry.
#[derive(Debug, Clone)]
pub struct SubgraphMlp {
    norm0: InstanceNorm,
    l1: Linear,
    norm1: InstanceNorm,
    l2: Linear,
    norm2: InstanceNorm,
    l3: Linear,
}

impl SubgraphMlp {
    /// The MLP with input/output width `dim` and hidden width `hidden`, parameters under `vb`.
    pub fn new(dim: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(SubgraphMlp {
            norm0: InstanceNorm::new(vb.pp("in0"))?,
            l1: candle_nn::linear(dim, hidden, vb.pp("fc1"))?,
            norm1: InstanceNorm::new(vb.pp("in1"))?,
            l2: candle_nn::linear(hidden, hidden, vb.pp("fc2"))?,
            norm2: InstanceNorm::new(vb.pp("in2"))?,
            l3: candle_nn::linear(hidden, dim, vb.pp("fc3"))?,
        })
    }
}

impl Module for SubgraphMlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.l1.forward(&self.norm0.forward(x)?)?.relu()?;
        let h = self.l2.forward(&self.norm1.forward(&h)?)?.relu()?;
        self.l3.forward(&self.norm2.forward(&h)?)
    }
}

impl SubgraphMlp {
    /// The MLP's output at `x` with what its Jacobian there needs (the standardised rows of
    /// each InstanceNorm and the ReLU masks), for [`MlpAt::jvp`] and [`MlpAt::vjp`].
    pub(crate) fn at(&self, x: &Tensor) -> Result<MlpAt<'_>> {
        let affine = |n: &InstanceNorm, xhat: &Tensor| -> candle_core::Result<Tensor> {
            xhat.broadcast_mul(&n.gamma)?.broadcast_add(&n.beta)
        };
        let (xhat0, sigma0) = InstanceNorm::standardise(x)?;
        let z1 = self.l1.forward(&affine(&self.norm0, &xhat0)?)?;
        let h1 = z1.relu()?;
        let (xhat1, sigma1) = InstanceNorm::standardise(&h1)?;
        let z2 = self.l2.forward(&affine(&self.norm1, &xhat1)?)?;
        let h2 = z2.relu()?;
        let (xhat2, sigma2) = InstanceNorm::standardise(&h2)?;
        let y = self.l3.forward(&affine(&self.norm2, &xhat2)?)?;
        // PyTorch's ReLU passes the gradient where its output is > 0 (a constant mask: the
        // derivative of a derivative through ReLU is 0 almost everywhere).
        let mask = |z: &Tensor| -> candle_core::Result<Tensor> { z.gt(0.0)?.to_dtype(z.dtype()) };
        Ok(MlpAt {
            mlp: self,
            norms: [(xhat0, sigma0), (xhat1, sigma1), (xhat2, sigma2)],
            masks: [mask(&z1)?, mask(&z2)?],
            y,
        })
    }
}

/// [`SubgraphMlp`] linearised at an input: its output `y` and its Jacobian there, applied
/// forward ([`MlpAt::jvp`]) or transposed ([`MlpAt::vjp`]) with candle ops, so that the
/// result stays differentiable w.r.t. the MLP's parameters (what the authors' alternating
/// update needs, [`super::alternating`]).
pub(crate) struct MlpAt<'a> {
    mlp: &'a SubgraphMlp,
    norms: [(Tensor, Tensor); 3],
    masks: [Tensor; 2],
    /// The MLP's output.
    pub(crate) y: Tensor,
}

impl MlpAt<'_> {
    /// `J dx`: the change of the output for an input change `dx` (`m × D`).
    pub(crate) fn jvp(&self, dx: &Tensor) -> Result<Tensor> {
        let m = self.mlp;
        let [(x0, s0), (x1, s1), (x2, s2)] = &self.norms;
        let d = m.norm0.jvp(x0, s0, dx)?.matmul(&m.l1.weight().t()?)?;
        let d = (d * &self.masks[0])?;
        let d = m.norm1.jvp(x1, s1, &d)?.matmul(&m.l2.weight().t()?)?;
        let d = (d * &self.masks[1])?;
        Ok(m.norm2.jvp(x2, s2, &d)?.matmul(&m.l3.weight().t()?)?)
    }

    /// `Jᵀ gy`: the input cotangent of an output cotangent `gy` (`m × D`).
    pub(crate) fn vjp(&self, gy: &Tensor) -> Result<Tensor> {
        let m = self.mlp;
        let [(x0, s0), (x1, s1), (x2, s2)] = &self.norms;
        let g = m.norm2.vjp(x2, s2, &gy.matmul(m.l3.weight())?)?;
        let g = (g * &self.masks[1])?.matmul(m.l2.weight())?;
        let g = m.norm1.vjp(x1, s1, &g)?;
        let g = (g * &self.masks[0])?.matmul(m.l1.weight())?;
        Ok(m.norm0.vjp(x0, s0, &g)?)
    }
}

/// A (meta-trained) SSR module: its configuration, task, MLP(s) and temperature.
pub struct SsrModel {
    /// Hyperparameters.
    pub config: SsrConfig,
    /// The graphs it refines.
    pub task: Task,
    /// Every trainable variable (MLPs and `τ`), by name, seeded by name.
    pub params: ParamStore,
    pub(crate) mlps: Vec<SubgraphMlp>,
    pub(crate) tau: Tensor,
    pub(crate) dtype: DType,
}

impl std::fmt::Debug for SsrModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsrModel")
            .field("config", &self.config)
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl SsrModel {
    /// A freshly initialised model (candle's Linear initialisation, drawn from a stream seeded
    /// by `seed` and each variable's name, [`ParamStore`]) in `dtype` (F32 or F64).
    pub fn new(config: SsrConfig, task: Task, dtype: DType, seed: u64) -> Result<Self> {
        config.validate()?;
        let dim = task.input_dim(&config)?;
        let device = Device::Cpu;
        let params = ParamStore::new(seed);
        let vb = params.var_builder(dtype, &device);
        let names = match config.schedule {
            GroupSchedule::Joint => vec!["g"],
            GroupSchedule::Alternating => match task {
                Task::Retrieval { .. } => vec!["query", "database"],
                Task::FewShot { .. } => vec!["support", "query"],
            },
        };
        let mlps = names
            .iter()
            .map(|n| SubgraphMlp::new(dim, config.hidden, vb.pp(*n)))
            .collect::<Result<Vec<_>>>()?;
        let tau = vb.get_with_hints(1, "tau", candle_nn::Init::Const(config.tau_init))?;
        let model = SsrModel {
            config,
            task,
            params,
            mlps,
            tau,
            dtype,
        };
        if model.config.zero_init_output {
            model.zero_update_signal()?;
        }
        Ok(model)
    }

    /// The temperature `τ`.
    pub fn tau(&self) -> Result<f64> {
        Ok(self.tau.to_dtype(DType::F64)?.to_vec1::<f64>()?[0])
    }

    /// The trainable variables, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.params.all()
    }

    /// Sets every output of the MLPs to 0 (last layer weights and biases zeroed): SSR then
    /// leaves the features unchanged.
    pub fn zero_update_signal(&self) -> Result<()> {
        for (name, var) in self.vars() {
            if name.contains("fc3.") {
                var.set(&var.zeros_like()?)?;
            }
        }
        Ok(())
    }

    /// Saves the model (safetensors, atomic write) with its configuration and task.
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let json = serde_json::to_string(&(&self.config, &self.task))
            .map_err(|e| Error::file(path, format!("cannot serialise the SSR config: {e}")))?;
        let tensors: Vec<(String, Tensor)> = self
            .vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        crate::train::checkpoint::save(path, &tensors, &json)
    }

    /// Loads a model written by [`SsrModel::save`]; errors name the file (unreadable, not an
    /// SSR checkpoint, missing or mis-shaped tensors).
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let (tensors, json) = crate::train::checkpoint::load(path, &Device::Cpu)?;
        let (config, task): (SsrConfig, Task) = serde_json::from_str(&json)
            .map_err(|e| Error::file(path, format!("not an SSR checkpoint: {e}")))?;
        let dtype = tensors
            .values()
            .next()
            .map(|t| t.dtype())
            .ok_or_else(|| Error::file(path, "the checkpoint holds no tensor"))?;
        let model = SsrModel::new(config, task, dtype, 0)?;
        for (name, var) in model.vars() {
            let t = tensors
                .get(&name)
                .ok_or_else(|| Error::file(path, format!("tensor `{name}` is missing")))?;
            if t.dims() != var.dims() {
                return Err(Error::file(
                    path,
                    format!(
                        "tensor `{name}` has shape {:?}, expected {:?}",
                        t.dims(),
                        var.dims()
                    ),
                ));
            }
            var.set(&t.to_dtype(dtype)?)?;
        }
        Ok(model)
    }
}

impl Task {
    /// Number of nodes of the graph (`k + 1`, or supports + queries).
    pub fn nodes(&self) -> usize {
        match *self {
            Task::Retrieval { k } => k + 1,
            Task::FewShot { supports, queries } => supports + queries,
        }
    }

    /// The MLP's input width under `config` (its subgraph layout, rows, columns and
    /// decomposition); errors on an empty graph, on row/column groups the task does not have,
    /// and on k-reciprocal input parameters too large for the graph.
    pub fn input_dim(&self, config: &SsrConfig) -> Result<usize> {
        let dim = config.subgraph_spec().input_dim(*self)?;
        if let SsrInput::KReciprocal { alpha, k1, k2 } = config.input {
            crate::rerank::k_reciprocal::KReciprocal {
                k1,
                k2,
                lambda: alpha,
            }
            .validate(self.nodes())
            .map_err(|e| Error::invalid("input.k_reciprocal", e.to_string()))?;
        }
        Ok(dim)
    }
}

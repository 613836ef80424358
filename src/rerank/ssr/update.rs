//! SSR's feature update (Sec. 2.1, Eqs. 1–5) as explicit, differentiable candle tensor ops,
//! and its losses (Eqs. 6–7).
//!
//! candle has no second-order autograd, so the update is not obtained by differentiating a
//! loss: the closed form `∂s_ij/∂f_i = (f̂_j − s_ij f̂_i) / ‖f_i‖` (cosine similarity) is
//! written out, and `Σ_j G_ij ∂s_ij/∂f_i = (G F̂ − (G ⊙ S)𝟙 ⊙ F̂) / ‖F‖` row by row. Every op
//! (normalisation, Gram matrix, gather of the subgraphs, MLP, GraphSum scatter-add, the
//! update) has a first-order backward in candle, so the meta-loss after `T` updates is
//! differentiable w.r.t. the MLP's parameters and `τ`.

use super::alternating::{pull_back, HalfStep, Linearization};
use super::graph::{cosine_graph, graph_sum, subgraphs, SubgraphIndex, Task};
use super::model::{GroupSchedule, RetrievalLoss, SsrInput, SsrModel, UpdateRule, UpdateSpace};
use crate::error::{Error, Result};
use crate::rerank::k_reciprocal::KReciprocal;
use candle_core::{DType, Device, Tensor};
use candle_nn::Module;

/// SSR Eq. 4 for every node at once: the feature step `Σ_j A_ij ∂s_ij/∂f_i`
/// `= (A F̂ − (A ⊙ S)𝟙 ⊙ F̂) / ‖f_i‖` for a signal matrix `A` (`n × n`), with
/// `∂s_ij/∂f_i = (f̂_j − s_ij f̂_i)/‖f_i‖` the closed-form derivative of cosine similarity.
pub fn feature_direction(a: &Tensor, norms: &Tensor, fhat: &Tensor, s: &Tensor) -> Result<Tensor> {
    let af = a.matmul(fhat)?;
    let b = (a * s)?.sum_keepdim(1)?;
    Ok((af - fhat.broadcast_mul(&b)?)?.broadcast_div(norms)?)
}

/// SSR Eq. 4 with a given GraphSum matrix `G` (`n × n`): `f_i ← f_i + λ Σ_j G_ij ∂s_ij/∂f_i`
/// ([`UpdateRule::Paper`]) or `f ← f − λ ∂(Σ G ⊙ S)/∂f` (the authors' code, first order:
/// the other rows held fixed), for the rows where `mask` (`n × 1`, 0/1) is 1.
pub fn feature_step(
    f: &Tensor,
    g: &Tensor,
    mask: &Tensor,
    lambda: f64,
    rule: UpdateRule,
) -> Result<Tensor> {
    let (norms, fhat, s) = cosine_graph(f)?;
    let (a, sign) = match rule {
        UpdateRule::Paper => (g.clone(), 1.0),
        UpdateRule::AuthorsCode | UpdateRule::AuthorsCodeFirstOrder => ((g + g.t()?)?, -1.0),
    };
    let dir = feature_direction(&a, &norms, &fhat, &s)?;
    Ok((f + (dir.broadcast_mul(mask)? * (sign * lambda))?)?)
}

impl SsrModel {
    /// The subgraphs of the current similarities (the sort is not differentiated).
    pub fn subgraphs(&self, s: &Tensor) -> Result<SubgraphIndex> {
        let n = s.dims()[0];
        if n != self.task.nodes() {
            return Err(Error::Shape(format!(
                "a {n}-node similarity matrix for {:?}",
                self.task
            )));
        }
        let sim: Vec<f64> = s
            .detach()
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        Ok(subgraphs(&sim, self.task, &self.config.subgraph_spec()))
    }

    /// The fixed Jaccard matrix `J` of SSR Sec. 2.3 (`n × n`, not differentiated) from the
    /// initial (normalised) features `f`, if the input is [`SsrInput::KReciprocal`].
    pub fn fixed_jaccard(&self, f: &Tensor) -> Result<Option<Tensor>> {
        let SsrInput::KReciprocal { alpha, k1, k2 } = self.config.input else {
            return Ok(None);
        };
        let n = f.dims()[0];
        let (_, _, s) = cosine_graph(&f.detach().to_dtype(DType::F64)?)?;
        let cos = s.flatten_all()?.to_vec1::<f64>()?;
        let j = KReciprocal {
            k1,
            k2,
            lambda: alpha,
        }
        .jaccard_from_similarities(&cos, n)?;
        Ok(Some(
            Tensor::from_vec(j, (n, n), f.device())?.to_dtype(self.dtype)?,
        ))
    }

    /// What the MLP reads at similarities `s`: `s` itself, or SSR Eq. 9's
    /// `D = 2α(1 − S) + (1 − α)J` when `jaccard` is given.
    pub fn mlp_input(&self, s: &Tensor, jaccard: Option<&Tensor>) -> Result<Tensor> {
        match (self.config.input, jaccard) {
            (SsrInput::KReciprocal { alpha, .. }, Some(j)) => {
                Ok(((s.affine(-2.0 * alpha, 2.0 * alpha)?) + (j * (1.0 - alpha))?)?)
            }
            (SsrInput::KReciprocal { .. }, None) => Err(Error::invalid(
                "input",
                "the k-reciprocal input needs the Jaccard matrix of the initial features",
            )),
            (SsrInput::Similarity, _) => Ok(s.clone()),
        }
    }

    /// The GraphSum matrix `G(S)` (Eqs. 2 and 5) of MLP `which` at similarities `s` (`n × n`),
    /// reading `s` or Eq. 9's `D` (with `jaccard`, [`SsrModel::fixed_jaccard`]) at the
    /// subgraph positions.
    pub fn update_signal(
        &self,
        s: &Tensor,
        jaccard: Option<&Tensor>,
        which: usize,
    ) -> Result<Tensor> {
        let index = self.subgraphs(s)?;
        let idx = Tensor::from_vec(index.flat.clone(), index.flat.len(), s.device())?;
        let x = self
            .mlp_input(s, jaccard)?
            .flatten_all()?
            .index_select(&idx, 0)?
            .reshape((index.subgraphs, index.dim))?;
        let g = self.mlps[which].forward(&x)?;
        graph_sum(&g, &index, &idx)
    }

    /// `∂(MLP input)/∂S`: 1, or `−2α` when the MLP reads Eq. 9's `D = 2α(1 − S) + (1 − α)J`.
    pub(crate) fn input_scale(&self) -> f64 {
        match self.config.input {
            SsrInput::Similarity => 1.0,
            SsrInput::KReciprocal { alpha, .. } => -2.0 * alpha,
        }
    }

    /// One SSR update (Eq. 4 with the learned `G`) of the rows selected by `mask`, with MLP
    /// `which` (and the fixed `jaccard` of the k-reciprocal input). Under the authors' rule
    /// this is the first-order step: the other rows are taken as given, which is the
    /// authors' update only for the first group of the first step ([`SsrModel::refine`]
    /// adds the path through the other group's update).
    pub fn step(
        &self,
        f: &Tensor,
        which: usize,
        mask: &Tensor,
        jaccard: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (_, _, s) = cosine_graph(f)?;
        let g = self.update_signal(&s, jaccard, which)?;
        feature_step(f, &g, mask, self.config.lambda, self.config.rule)
    }

    /// Checks the node count against the task and the features for NaN/∞ and zero rows;
    /// returns them in the model's dtype, as given (the authors normalise only to form the
    /// similarities) or L2-normalised with [`SsrConfig::normalize_input`](super::SsrConfig).
    fn prepare(&self, f: &Tensor) -> Result<Tensor> {
        let dims = f.dims();
        let n = match self.task {
            Task::Retrieval { k } => k + 1,
            Task::FewShot { supports, queries } => supports + queries,
        };
        if dims.len() != 2 || dims[0] != n || dims[1] == 0 {
            return Err(Error::Shape(format!(
                "SSR expects {n} node features (one per row, ≥ 1 column) for {:?}, got {dims:?}",
                self.task
            )));
        }
        let f = f.to_dtype(self.dtype)?;
        let vals = f.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        if let Some(p) = vals.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "features",
                format!("node {} contains NaN or infinity", p / dims[1]),
            ));
        }
        let norms = f.sqr()?.sum_keepdim(1)?.sqrt()?;
        let nv = norms
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        if let Some(p) = nv.iter().position(|&v| v <= 1e-12) {
            return Err(Error::invalid(
                "features",
                format!("node {p} has a zero feature vector (its cosine similarity is undefined)"),
            ));
        }
        if self.config.normalize_input {
            return Ok(f.broadcast_div(&norms)?);
        }
        Ok(f)
    }

    /// `T` SSR updates of the node features `f` (`n × d`; retrieval: row 0 the query, rows
    /// `1..=k` its references; few-shot: the support nodes then the queries), following the
    /// configured schedule. The features are moved as given (the similarities are cosines,
    /// so their scale sets each node's step, as in the authors' code) unless
    /// `normalize_input` is set. Returns the refined features. Errors with
    /// [`UpdateSpace::Similarity`] (no features are refined; see
    /// [`SsrModel::refined_similarity`]).
    pub fn refine(&self, f: &Tensor) -> Result<Tensor> {
        if self.config.update_space == UpdateSpace::Similarity {
            return Err(Error::invalid(
                "update_space",
                "\"similarity\" refines S directly (Eq. 2), not the features; use \
                 refined_similarity",
            ));
        }
        let f = self.prepare(f)?;
        let jaccard = self.fixed_jaccard(&f)?;
        self.refine_prepared(f, jaccard.as_ref())
    }

    /// The feature updates of [`SsrModel::refine`] on prepared features.
    fn refine_prepared(&self, mut f: Tensor, jaccard: Option<&Tensor>) -> Result<Tensor> {
        let n = f.dims()[0];
        let dev = f.device().clone();
        let ones = Tensor::ones((n, 1), self.dtype, &dev)?;
        let group = |first: bool| -> Result<Tensor> {
            let split = match self.task {
                Task::Retrieval { .. } => 1,
                Task::FewShot { supports, .. } => supports,
            };
            let v: Vec<f64> = (0..n)
                .map(|i| if (i < split) == first { 1.0 } else { 0.0 })
                .collect();
            Ok(Tensor::from_vec(v, (n, 1), &Device::Cpu)?.to_dtype(self.dtype)?)
        };
        if self.config.schedule == GroupSchedule::Alternating
            && self.config.rule == UpdateRule::AuthorsCode
        {
            return self.refine_authors_alternating(f, [group(true)?, group(false)?], jaccard);
        }
        for _ in 0..self.config.steps {
            match self.config.schedule {
                GroupSchedule::Joint => f = self.step(&f, 0, &ones, jaccard)?,
                GroupSchedule::Alternating => {
                    f = self.step(&f, 0, &group(true)?, jaccard)?;
                    f = self.step(&f, 1, &group(false)?, jaccard)?;
                }
            }
        }
        Ok(f)
    }

    /// The authors' alternating updates with autograd's total derivative
    /// ([`super::alternating`]): `grad_h = [V_h]_X + L_hᵀ [V_h]_Y` for the group `X` of
    /// half-step `h`, where `L_h` is the Jacobian of the other group's latest update.
    fn refine_authors_alternating(
        &self,
        mut f: Tensor,
        groups: [Tensor; 2],
        jaccard: Option<&Tensor>,
    ) -> Result<Tensor> {
        let lambda = self.config.lambda;
        let mut chain: Vec<HalfStep> = Vec::with_capacity(2 * self.config.steps);
        for _ in 0..self.config.steps {
            for which in 0..2 {
                let at = Linearization::new(self, &f, which, jaccard)?;
                let (updated, held) = (&groups[which], &groups[1 - which]);
                let mut grad = at.v.broadcast_mul(updated)?;
                if let Some(extra) = pull_back(&chain, &at.v.broadcast_mul(held)?, lambda)? {
                    grad = (grad + extra)?;
                }
                f = (&f - (grad * lambda)?)?;
                chain.push(HalfStep {
                    at,
                    updated: updated.clone(),
                    held: held.clone(),
                });
            }
        }
        Ok(f)
    }

    /// The refined similarity matrix `S^T` (`n × n`) of the node features `f` (same layout as
    /// [`SsrModel::refine`]): the cosine similarities of the refined features
    /// ([`UpdateSpace::Features`], Eqs. 3–4), or `T` unconstrained updates
    /// `S^t = S^{t−1} + λ G(S^{t−1})` of the initial cosine similarities
    /// ([`UpdateSpace::Similarity`], Eq. 2, Tables 3–4 "w.o feat. update").
    pub fn refined_similarity(&self, f: &Tensor) -> Result<Tensor> {
        let f = self.prepare(f)?;
        let jaccard = self.fixed_jaccard(&f)?;
        match self.config.update_space {
            UpdateSpace::Features => {
                let r = self.refine_prepared(f, jaccard.as_ref())?;
                Ok(cosine_graph(&r)?.2)
            }
            UpdateSpace::Similarity => {
                let mut s = cosine_graph(&f)?.2;
                for _ in 0..self.config.steps {
                    let g = self.update_signal(&s, jaccard.as_ref(), 0)?;
                    s = (&s + (g * self.config.lambda)?)?;
                }
                Ok(s)
            }
        }
    }

    /// Refined similarities `s^T(q, ·)` of the query (row 0) to its `k` references.
    pub fn refine_retrieval(&self, f: &Tensor) -> Result<Vec<f64>> {
        let s = self.refined_similarity(f)?;
        let row = s.get(0)?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        Ok(row[1..].to_vec())
    }

    /// SSR Eq. 6 (or the code's query row, [`RetrievalLoss`]) after `T` updates, for the
    /// query (row 0) and its references with `positive[j]` = reference `j` is of the query's
    /// class. Errors if there is no positive or no negative.
    pub fn retrieval_loss(&self, f: &Tensor, positive: &[bool]) -> Result<Tensor> {
        let n = positive.len() + 1;
        let pos: Vec<bool> = std::iter::once(true)
            .chain(positive.iter().copied())
            .collect();
        if !positive.iter().any(|&p| p) || positive.iter().all(|&p| p) {
            return Err(Error::invalid(
                "positive",
                "the re-ranked list needs at least one positive and one negative",
            ));
        }
        let rows: Vec<usize> = match self.config.retrieval_loss {
            RetrievalLoss::AllPositivePairs => (0..n).filter(|&i| pos[i]).collect(),
            RetrievalLoss::QueryRow => vec![0],
        };
        let mut pm = vec![0.0; n * n];
        let mut nm = vec![0.0; n * n];
        for &i in &rows {
            for j in 0..n {
                if j != i && pos[j] {
                    pm[i * n + j] = 1.0;
                }
                if !pos[j] {
                    nm[i * n + j] = 1.0;
                }
            }
        }
        let s = self.refined_similarity(f)?;
        self.contrastive(&s, pm, nm, n, n)
    }

    /// `mean over (i, j) ∈ pos of −log(e^{τs_ij} / (e^{τs_ij} + Σ_{k ∈ neg(i)} e^{τs_ik}))`
    /// `= softplus(log Σ_k e^{τs_ik} − τs_ij)` for masks `pm`, `nm` over `s` (`r × c`).
    fn contrastive(
        &self,
        s: &Tensor,
        pm: Vec<f64>,
        nm: Vec<f64>,
        r: usize,
        c: usize,
    ) -> Result<Tensor> {
        let dev = s.device();
        let count = pm.iter().sum::<f64>();
        // Rows without a negative (not scored) get a 1 in the sum so that its log stays finite.
        let empty: Vec<f64> = nm
            .chunks(c)
            .map(|row| {
                if row.iter().any(|&v| v > 0.0) {
                    0.0
                } else {
                    1.0
                }
            })
            .collect();
        let empty = Tensor::from_vec(empty, (r, 1), dev)?.to_dtype(self.dtype)?;
        let pm = Tensor::from_vec(pm, (r, c), dev)?.to_dtype(self.dtype)?;
        let nm = Tensor::from_vec(nm, (r, c), dev)?.to_dtype(self.dtype)?;
        let logits = s.broadcast_mul(&self.tau)?;
        // A stable log-sum-exp over the negatives: shift by the largest negative logit and
        // keep the other columns at exp(−30) × 0.
        let off = ((&nm - 1.0)? * 1e4)?;
        let shift = (logits.detach() + &off)?.max_keepdim(1)?;
        let z = ((logits.broadcast_sub(&shift)? * &nm)? + ((&nm - 1.0)? * 30.0)?)?;
        let sum = ((z.exp()? * &nm)?.sum_keepdim(1)? + empty)?;
        let lse = sum.log()?.broadcast_add(&shift)?;
        let x = lse.broadcast_sub(&logits)?;
        // softplus(x) = max(x, 0) + log(1 + e^{−|x|}).
        let sp = (x.relu()? + ((x.abs()?.neg()?.exp()? + 1.0)?.log()?))?;
        Ok(((sp * pm)?.sum_all()? / count)?)
    }

    /// SSR Eq. 7 after `T` updates: queries against support nodes of their class, negatives
    /// the support nodes of other classes, averaged over the pairs (with one support node per
    /// class, the code's cross-entropy of `τ·cos`). `f` holds the support nodes then the
    /// queries.
    pub fn few_shot_loss(
        &self,
        f: &Tensor,
        support_labels: &[usize],
        query_labels: &[usize],
    ) -> Result<Tensor> {
        let (s_n, q_n) = (support_labels.len(), query_labels.len());
        // The query × support block of S^T.
        let s = self
            .refined_similarity(f)?
            .narrow(0, s_n, q_n)?
            .narrow(1, 0, s_n)?;
        let mut pm = vec![0.0; q_n * s_n];
        let mut nm = vec![0.0; q_n * s_n];
        for (i, &y) in query_labels.iter().enumerate() {
            for (j, &l) in support_labels.iter().enumerate() {
                if l == y {
                    pm[i * s_n + j] = 1.0;
                } else {
                    nm[i * s_n + j] = 1.0;
                }
            }
        }
        if pm.iter().sum::<f64>() == 0.0 || nm.iter().sum::<f64>() == 0.0 {
            return Err(Error::invalid(
                "labels",
                "Eq. 7 needs a support node of each query's class and one of another class",
            ));
        }
        self.contrastive(&s, pm, nm, q_n, s_n)
    }

    /// Class scores after `T` updates: cosine of each refined query with each class's mean
    /// refined support node (`n_way` columns), row-major. With [`UpdateSpace::Similarity`]
    /// (no refined features), the mean of `s^T(query, ·)` over the class's support nodes.
    pub fn few_shot_scores(
        &self,
        f: &Tensor,
        support_labels: &[usize],
        n_way: usize,
    ) -> Result<Vec<Vec<f64>>> {
        let s_n = support_labels.len();
        if self.config.update_space == UpdateSpace::Similarity {
            // No refined features to average: the mean refined similarity to the class's
            // support nodes (with one node per class, the similarity to its prototype).
            let s = self
                .refined_similarity(f)?
                .to_dtype(DType::F64)?
                .to_vec2::<f64>()?;
            let mut counts = vec![0usize; n_way];
            for &l in support_labels {
                counts[l] += 1;
            }
            return Ok(s[s_n..]
                .iter()
                .map(|row| {
                    let mut sums = vec![0.0; n_way];
                    for (v, &l) in row[..s_n].iter().zip(support_labels) {
                        sums[l] += v;
                    }
                    sums.iter()
                        .zip(&counts)
                        .map(|(x, &c)| {
                            if c == 0 {
                                f64::NEG_INFINITY
                            } else {
                                x / c as f64
                            }
                        })
                        .collect()
                })
                .collect());
        }
        let r = self.refine(f)?;
        let rows = r.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        let dim = rows[0].len();
        let mut protos = vec![vec![0.0; dim]; n_way];
        for (row, &l) in rows[..s_n].iter().zip(support_labels) {
            for (p, v) in protos[l].iter_mut().zip(row) {
                *p += v;
            }
        }
        let protos: Vec<Vec<f64>> = protos
            .iter()
            .map(|p| crate::fewshot::normalized(p))
            .collect();
        Ok(rows[s_n..]
            .iter()
            .map(|q| {
                let q = crate::fewshot::normalized(q);
                protos
                    .iter()
                    .map(|p| p.iter().zip(&q).map(|(a, b)| a * b).sum())
                    .collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rerank::ssr::graph::{ColumnOrder, Decomposition, Layout, NodeGroup};
    use crate::rerank::ssr::model::{GroupSchedule, SsrConfig};

    fn feats(n: usize, d: usize, seed: u64) -> Vec<f64> {
        // Deterministic pseudo-random features in [-1, 1].
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n * d)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    fn cos(a: &[f64], b: &[f64]) -> f64 {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
        dot / (na * nb)
    }

    fn t(v: &[f64], n: usize, d: usize) -> Tensor {
        Tensor::from_vec(v.to_vec(), (n, d), &Device::Cpu).unwrap()
    }

    #[test]
    fn closed_form_cosine_derivative_matches_finite_differences() {
        let (n, d) = (4, 3);
        let f = feats(n, d, 1);
        for (i, j) in [(0usize, 1usize), (2, 3), (3, 0)] {
            let mut g = vec![0.0; n * n];
            g[i * n + j] = 1.0;
            let ones = Tensor::ones((n, 1), DType::F64, &Device::Cpu).unwrap();
            let stepped = feature_step(&t(&f, n, d), &t(&g, n, n), &ones, 1.0, UpdateRule::Paper)
                .unwrap()
                .to_vec2::<f64>()
                .unwrap();
            for k in 0..d {
                let eps = 1e-6;
                let mut p = f[i * d..(i + 1) * d].to_vec();
                let mut m = p.clone();
                p[k] += eps;
                m[k] -= eps;
                let fj = &f[j * d..(j + 1) * d];
                let fd = (cos(&p, fj) - cos(&m, fj)) / (2.0 * eps);
                let closed = stepped[i][k] - f[i * d + k];
                assert!(
                    (fd - closed).abs() < 1e-8,
                    "∂s_{i}{j}/∂f_{i}[{k}]: {closed} vs {fd}"
                );
            }
            // Only row i moves.
            for r in (0..n).filter(|&r| r != i) {
                for k in 0..d {
                    assert!((stepped[r][k] - f[r * d + k]).abs() < 1e-15);
                }
            }
        }
    }

    fn tiny_model(
        task: Task,
        layout: Layout,
        rule: UpdateRule,
        schedule: GroupSchedule,
    ) -> SsrModel {
        SsrModel::new(
            SsrConfig {
                hidden: 6,
                steps: 1,
                lambda: 0.05,
                layout,
                rule,
                schedule,
                ..SsrConfig::default()
            },
            task,
            DType::F64,
            3,
        )
        .unwrap()
    }

    /// One SSR step computed with plain loops from the MLP's outputs.
    fn reference_step(
        f: &[f64],
        n: usize,
        d: usize,
        g_out: &[f64],
        index: &SubgraphIndex,
        lambda: f64,
        rule: UpdateRule,
    ) -> Vec<f64> {
        let norm: Vec<f64> = (0..n)
            .map(|i| {
                f[i * d..(i + 1) * d]
                    .iter()
                    .map(|x| x * x)
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let unit = |i: usize, k: usize| f[i * d + k] / norm[i];
        let s = |i: usize, j: usize| (0..d).map(|k| unit(i, k) * unit(j, k)).sum::<f64>();
        let mut g = vec![0.0; n * n];
        for (p, &v) in index.flat.iter().zip(g_out) {
            g[*p as usize] += v;
        }
        let mut out = f.to_vec();
        for i in 0..n {
            for j in 0..n {
                let a = match rule {
                    UpdateRule::Paper => g[i * n + j],
                    UpdateRule::AuthorsCode | UpdateRule::AuthorsCodeFirstOrder => {
                        -(g[i * n + j] + g[j * n + i])
                    }
                };
                for k in 0..d {
                    out[i * d + k] += lambda * a * (unit(j, k) - s(i, j) * unit(i, k)) / norm[i];
                }
            }
        }
        out
    }

    #[test]
    fn one_step_matches_a_plain_loop_reference() {
        let (k, d) = (5, 4);
        let n = k + 1;
        // Raw features of norms 1–4: SSR moves them as given (the authors normalise only to
        // form the similarities), so each node's step carries 1/‖f_i‖.
        let f: Vec<f64> = feats(n, d, 7)
            .chunks(d)
            .enumerate()
            .flat_map(|(i, r)| {
                r.iter()
                    .map(move |x| x * (1.0 + i as f64 * 0.6))
                    .collect::<Vec<_>>()
            })
            .collect();
        let raw = f.clone();
        let rules = [
            UpdateRule::Paper,
            UpdateRule::AuthorsCode,
            UpdateRule::AuthorsCodeFirstOrder,
        ];
        for layout in [Layout::Paper, Layout::AuthorsCode] {
            for rule in rules {
                let model = tiny_model(Task::Retrieval { k }, layout, rule, GroupSchedule::Joint);
                let refined = model
                    .refine(&t(&raw, n, d))
                    .unwrap()
                    .to_vec2::<f64>()
                    .unwrap();
                // The MLP's output on the subgraphs, read back.
                let ft = t(&f, n, d);
                let (_, _, s) = cosine_graph(&ft).unwrap();
                let index = model.subgraphs(&s).unwrap();
                let idx =
                    Tensor::from_vec(index.flat.clone(), index.flat.len(), &Device::Cpu).unwrap();
                let x = s
                    .flatten_all()
                    .unwrap()
                    .index_select(&idx, 0)
                    .unwrap()
                    .reshape((n, index.dim))
                    .unwrap();
                let g_out = model.mlps[0]
                    .forward(&x)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap();
                // The subgraph input is what the loops read from S.
                let sv = s.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                let xv = x.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                for (p, v) in index.flat.iter().zip(&xv) {
                    assert_eq!(sv[*p as usize], *v);
                }
                let expect = reference_step(&f, n, d, &g_out, &index, 0.05, rule);
                for i in 0..n {
                    for c in 0..d {
                        assert!(
                            (refined[i][c] - expect[i * d + c]).abs() < 1e-12,
                            "{layout:?} {rule:?} [{i}][{c}]: {} vs {}",
                            refined[i][c],
                            expect[i * d + c]
                        );
                    }
                }
                // The step moved something.
                assert!((0..n * d).any(|e| (expect[e] - f[e]).abs() > 1e-6));
            }
        }
    }

    #[test]
    fn meta_loss_gradient_matches_finite_differences() {
        let (k, d) = (5, 3);
        let n = k + 1;
        let f = t(&feats(n, d, 11), n, d);
        let positive = [true, false, true, false, false];
        // The paper's and the code's updates, and the differentiable paths of the ablations
        // (Tables 3–4) and of the k-reciprocal input (Sec. 2.3).
        type Variant = (&'static str, GroupSchedule, UpdateRule, fn(&mut SsrConfig));
        let variants: [Variant; 7] = [
            ("paper", GroupSchedule::Joint, UpdateRule::Paper, |_| {}),
            (
                "code",
                GroupSchedule::Alternating,
                UpdateRule::AuthorsCode,
                |_| {},
            ),
            (
                "code, first order",
                GroupSchedule::Alternating,
                UpdateRule::AuthorsCodeFirstOrder,
                |_| {},
            ),
            (
                "k-reciprocal input",
                GroupSchedule::Joint,
                UpdateRule::Paper,
                |c| {
                    c.input = SsrInput::KReciprocal {
                        alpha: 0.4,
                        k1: 2,
                        k2: 2,
                    }
                },
            ),
            (
                "w.o feat. update",
                GroupSchedule::Joint,
                UpdateRule::Paper,
                |c| c.update_space = UpdateSpace::Similarity,
            ),
            (
                "w.o subgraph",
                GroupSchedule::Joint,
                UpdateRule::Paper,
                |c| c.decomposition = Decomposition::WholeGraph,
            ),
            (
                "full rows, shared order",
                GroupSchedule::Joint,
                UpdateRule::Paper,
                |c| {
                    c.rows = Some(vec![
                        NodeGroup::Sample,
                        NodeGroup::Query,
                        NodeGroup::References,
                    ]);
                    c.order = ColumnOrder::Shared;
                },
            ),
        ];
        for (what, schedule, rule, change) in variants {
            let mut config =
                tiny_model(Task::Retrieval { k }, Layout::Paper, rule, schedule).config;
            change(&mut config);
            config.steps = 2;
            config.lambda = 0.2;
            let model = SsrModel::new(config, Task::Retrieval { k }, DType::F64, 3).unwrap();
            let schedule = what;
            let loss = model.retrieval_loss(&f, &positive).unwrap();
            let grads = loss.backward().unwrap();
            for (name, var) in model.vars() {
                if !(name.ends_with("fc1.weight")
                    || name.ends_with("fc2.bias")
                    || name == "tau"
                    || name.ends_with("in0.weight"))
                {
                    continue;
                }
                let grad = grads
                    .get(var.as_tensor())
                    .expect("a gradient")
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap();
                assert!(
                    grad.iter().any(|g| g.abs() > 1e-6),
                    "{schedule:?} {name}: no gradient"
                );
                let base = var.as_tensor().copy().unwrap();
                let flat = base.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                for e in [0, flat.len() - 1] {
                    let eval = |delta: f64| {
                        let mut v = flat.clone();
                        v[e] += delta;
                        var.set(&Tensor::from_vec(v, base.dims(), &Device::Cpu).unwrap())
                            .unwrap();
                        let l = model
                            .retrieval_loss(&f, &positive)
                            .unwrap()
                            .to_vec0::<f64>()
                            .unwrap();
                        var.set(&base).unwrap();
                        l
                    };
                    let h = 1e-5;
                    let fd = (eval(h) - eval(-h)) / (2.0 * h);
                    assert!(
                        (fd - grad[e]).abs() < 1e-6 * (1.0 + fd.abs()),
                        "{schedule:?} {name}[{e}]: autograd {} vs finite differences {fd}",
                        grad[e]
                    );
                }
            }
        }
    }

    #[test]
    fn zero_update_signal_leaves_features_unchanged() {
        // The features come back as given (not normalised), under every rule and schedule;
        // with `normalize_input` they come back as unit rows.
        let (s, q, d) = (3, 4, 5);
        let raw: Vec<f64> = feats(s + q, d, 5).iter().map(|x| 3.0 * x).collect();
        let rules = [
            (UpdateRule::Paper, GroupSchedule::Alternating),
            (UpdateRule::AuthorsCode, GroupSchedule::Alternating),
            (
                UpdateRule::AuthorsCodeFirstOrder,
                GroupSchedule::Alternating,
            ),
            (UpdateRule::AuthorsCode, GroupSchedule::Joint),
        ];
        for (rule, schedule) in rules {
            for normalize in [false, true] {
                let mut model = tiny_model(
                    Task::FewShot {
                        supports: s,
                        queries: q,
                    },
                    Layout::AuthorsCode,
                    rule,
                    schedule,
                );
                model.config.normalize_input = normalize;
                model.config.steps = 2;
                model.zero_update_signal().unwrap();
                let r = model
                    .refine(&t(&raw, s + q, d))
                    .unwrap()
                    .to_vec2::<f64>()
                    .unwrap();
                for i in 0..s + q {
                    let row = &raw[i * d..(i + 1) * d];
                    let nr = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let scale = if normalize { 1.0 / nr } else { 1.0 };
                    for c in 0..d {
                        assert!(
                            (r[i][c] - row[c] * scale).abs() < 1e-15,
                            "{rule:?} {schedule:?} normalize {normalize}"
                        );
                    }
                }
            }
        }
    }

    /// Plain-loop GraphSum of MLP outputs `g_out` at `index`'s positions.
    fn scatter(index: &SubgraphIndex, g_out: &[f64]) -> Vec<f64> {
        let mut g = vec![0.0; index.nodes * index.nodes];
        for (p, &v) in index.flat.iter().zip(g_out) {
            g[*p as usize] += v;
        }
        g
    }

    /// The MLP's output on the gathered inputs `x` (`subgraphs × D`, row-major).
    fn mlp_out(model: &SsrModel, x: &[f64], index: &SubgraphIndex) -> Vec<f64> {
        let xt = Tensor::from_vec(x.to_vec(), (index.subgraphs, index.dim), &Device::Cpu).unwrap();
        model.mlps[0]
            .forward(&xt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    }

    fn cosine_loops(raw: &[f64], n: usize, d: usize) -> Vec<f64> {
        (0..n * n)
            .map(|p| {
                cos(
                    &raw[p / n * d..(p / n + 1) * d],
                    &raw[p % n * d..(p % n + 1) * d],
                )
            })
            .collect()
    }

    #[test]
    fn without_feature_update_s_gets_g_added_directly() {
        // Table 3–4 "w.o feat. update": S^t = S^{t−1} + λ G(S^{t−1}) (Eq. 2), checked
        // against loops over two steps, for retrieval and few-shot graphs.
        let d = 4;
        for (task, rows) in [
            (Task::Retrieval { k: 5 }, None),
            (
                Task::FewShot {
                    supports: 2,
                    queries: 4,
                },
                Some(vec![
                    NodeGroup::Sample,
                    NodeGroup::Support,
                    NodeGroup::Query,
                ]),
            ),
        ] {
            let n = task.nodes();
            let config = SsrConfig {
                hidden: 6,
                steps: 2,
                lambda: 0.7,
                rows,
                update_space: UpdateSpace::Similarity,
                ..SsrConfig::default()
            };
            let model = SsrModel::new(config, task, DType::F64, 5).unwrap();
            let raw = feats(n, d, 21);
            let got = model
                .refined_similarity(&t(&raw, n, d))
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let mut s = cosine_loops(&raw, n, d);
            for _ in 0..2 {
                let index = subgraphs(&s, task, &model.config.subgraph_spec());
                let x: Vec<f64> = index.flat.iter().map(|&p| s[p as usize]).collect();
                let g = scatter(&index, &mlp_out(&model, &x, &index));
                for (a, b) in s.iter_mut().zip(&g) {
                    *a += 0.7 * b;
                }
            }
            let moved = s
                .iter()
                .zip(cosine_loops(&raw, n, d))
                .any(|(a, b)| (a - b).abs() > 1e-6);
            assert!(moved, "{task:?}: G is not zero");
            for (p, (a, b)) in got.iter().zip(&s).enumerate() {
                assert!((a - b).abs() < 1e-12, "{task:?} [{p}]: {a} vs {b}");
            }
            // There are no refined features.
            let e = model.refine(&t(&raw, n, d)).unwrap_err().to_string();
            assert!(e.contains("update_space"), "{e}");
        }
    }

    #[test]
    fn whole_graph_reads_and_predicts_the_whole_matrix() {
        // "w.o subgraph": one MLP input of n² entries per graph, one update per entry.
        let (k, d) = (4, 3);
        let n = k + 1;
        let task = Task::Retrieval { k };
        let config = SsrConfig {
            hidden: 5,
            decomposition: Decomposition::WholeGraph,
            ..SsrConfig::default()
        };
        let model = SsrModel::new(config, task, DType::F64, 2).unwrap();
        assert_eq!(
            model.params.get("g.fc1.weight").unwrap().dims(),
            &[5, n * n]
        );
        assert_eq!(
            model.params.get("g.fc3.weight").unwrap().dims(),
            &[n * n, 5]
        );
        let raw = feats(n, d, 4);
        let s = cosine_loops(&raw, n, d);
        let st = t(&s, n, n);
        let index = model.subgraphs(&st).unwrap();
        assert_eq!((index.subgraphs, index.dim), (1, n * n));
        let g = model
            .update_signal(&st, None, 0)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let x: Vec<f64> = index.flat.iter().map(|&p| s[p as usize]).collect();
        let expect = scatter(&index, &mlp_out(&model, &x, &index));
        // Every entry is predicted once: G is a permutation of the MLP's output.
        assert_eq!(g.len(), n * n);
        for (a, b) in g.iter().zip(&expect) {
            assert!((a - b).abs() < 1e-12);
        }
        let mut sorted = index.flat.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..(n * n) as u32).collect::<Vec<_>>());
    }

    #[test]
    fn k_reciprocal_input_is_eq_9_of_the_fixed_jaccard() {
        let (k, d) = (7, 3);
        let n = k + 1;
        let task = Task::Retrieval { k };
        let raw = feats(n, d, 9);
        let s = cosine_loops(&raw, n, d);
        let st = t(&s, n, n);
        let kr = |alpha: f64| SsrConfig {
            hidden: 4,
            input: SsrInput::KReciprocal {
                alpha,
                k1: 3,
                k2: 2,
            },
            ..SsrConfig::default()
        };
        // α = 1: D = 2(1 − S), an affine map of the similarity input.
        let m1 = SsrModel::new(kr(1.0), task, DType::F64, 0).unwrap();
        let j = m1.fixed_jaccard(&t(&raw, n, d)).unwrap().unwrap();
        let x = m1
            .mlp_input(&st, Some(&j))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        assert!((x[1] - 2.0 * (1.0 - s[1])).abs() < 1e-12);
        for (a, b) in x.iter().zip(&s) {
            assert!((a - (2.0 - 2.0 * b)).abs() < 1e-12);
        }
        // α = 0.3: D_ij = 0.6 (1 − s_ij) + 0.7 J_ij with J the k-reciprocal Jaccard distance.
        let m = SsrModel::new(kr(0.3), task, DType::F64, 0).unwrap();
        let j = m.fixed_jaccard(&t(&raw, n, d)).unwrap().unwrap();
        let jv = KReciprocal {
            k1: 3,
            k2: 2,
            lambda: 0.3,
        }
        .jaccard_from_similarities(&s, n)
        .unwrap();
        let jt = j.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        for (a, b) in jt.iter().zip(&jv) {
            assert!((a - b).abs() < 1e-9);
        }
        let x = m
            .mlp_input(&st, Some(&j))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let p = 2 * n + 5;
        assert!((x[p] - (0.6 * (1.0 - s[p]) + 0.7 * jv[p])).abs() < 1e-9);
        assert!(jv[p] > 0.0, "a pair with a non-trivial Jaccard distance");
        // Bad parameters name the field.
        for (bad, field) in [
            (kr(1.5), "alpha"),
            (
                SsrConfig {
                    input: SsrInput::KReciprocal {
                        alpha: 0.5,
                        k1: n,
                        k2: 2,
                    },
                    ..kr(0.5)
                },
                "k_reciprocal",
            ),
            (
                SsrConfig {
                    input: SsrInput::KReciprocal {
                        alpha: 0.5,
                        k1: 0,
                        k2: 2,
                    },
                    ..kr(0.5)
                },
                "k_reciprocal",
            ),
        ] {
            let e = SsrModel::new(bad, task, DType::F64, 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn invalid_ablation_combinations_are_errors() {
        let task = Task::FewShot {
            supports: 2,
            queries: 3,
        };
        for (config, field) in [
            (
                SsrConfig {
                    update_space: UpdateSpace::Similarity,
                    schedule: GroupSchedule::Alternating,
                    ..SsrConfig::default()
                },
                "schedule",
            ),
            (
                SsrConfig {
                    update_space: UpdateSpace::Similarity,
                    rule: UpdateRule::AuthorsCode,
                    ..SsrConfig::default()
                },
                "rule",
            ),
            (
                SsrConfig {
                    layout: Layout::AuthorsCode,
                    rows: Some(vec![NodeGroup::Sample]),
                    ..SsrConfig::default()
                },
                "rows",
            ),
        ] {
            let e = SsrModel::new(config, task, DType::F64, 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
        // The code's alternating schedule and layout do combine with the shared order and the
        // whole matrix with the alternating schedule.
        for config in [
            SsrConfig {
                hidden: 4,
                layout: Layout::AuthorsCode,
                schedule: GroupSchedule::Alternating,
                order: ColumnOrder::Shared,
                ..SsrConfig::default()
            },
            SsrConfig {
                hidden: 4,
                decomposition: Decomposition::WholeGraph,
                schedule: GroupSchedule::Alternating,
                ..SsrConfig::default()
            },
        ] {
            let model = SsrModel::new(config, task, DType::F64, 0).unwrap();
            let r = model.refine(&t(&feats(5, 3, 1), 5, 3)).unwrap();
            assert_eq!(r.dims(), &[5, 3]);
        }
    }

    #[test]
    fn ablation_configs_parse_from_toml() {
        let c: SsrConfig = toml::from_str(
            r#"
            rows = ["sample", "support", "query"]
            columns = ["query"]
            order = "shared"
            decomposition = "whole_graph"
            update_space = "similarity"
            input = { k_reciprocal = { alpha = 0.3, k1 = 20, k2 = 6 } }
            "#,
        )
        .unwrap();
        assert_eq!(c.columns, Some(vec![NodeGroup::Query]));
        assert_eq!(
            c.input,
            SsrInput::KReciprocal {
                alpha: 0.3,
                k1: 20,
                k2: 6
            }
        );
        let d: SsrConfig = toml::from_str("input = \"similarity\"").unwrap();
        assert_eq!(d, SsrConfig::default());
        assert!(toml::from_str::<SsrConfig>("rows = [\"other\"]").is_err());
        assert!(toml::from_str::<SsrConfig>("local_sort = false").is_err());
    }
}

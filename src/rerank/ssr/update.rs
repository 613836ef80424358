//! SSR's feature update (Sec. 2.1, Eqs. 1–5) as explicit, differentiable candle tensor ops,
//! and its losses (Eqs. 6–7).
//!
//! candle has no second-order autograd, so the update is not obtained by differentiating a
//! loss: the closed form `∂s_ij/∂f_i = (f̂_j − s_ij f̂_i) / ‖f_i‖` (cosine similarity) is
//! written out, and `Σ_j G_ij ∂s_ij/∂f_i = (G F̂ − (G ⊙ S)𝟙 ⊙ F̂) / ‖F‖` row by row. Every op
//! (normalisation, Gram matrix, gather of the subgraphs, MLP, GraphSum scatter-add, the
//! update) has a first-order backward in candle, so the meta-loss after `T` updates is
//! differentiable w.r.t. the MLP's parameters and `τ`.

use super::graph::{few_shot_subgraphs, retrieval_subgraphs, SubgraphIndex};
use super::model::{GroupSchedule, RetrievalLoss, SsrModel, Task, UpdateRule};
use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::Module;

/// Row norms `‖f_i‖` (`n × 1`), unit rows `f̂` and cosine similarities `S = F̂F̂ᵀ`
/// (SSR Eq. 1 / Eq. 3).
pub fn cosine_graph(f: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let norms = f.sqr()?.sum_keepdim(1)?.sqrt()?;
    let fhat = f.broadcast_div(&norms)?;
    let s = fhat.matmul(&fhat.t()?)?;
    Ok((norms, fhat, s))
}

/// SSR Eq. 4 for every node at once: the feature step `Σ_j A_ij ∂s_ij/∂f_i`
/// `= (A F̂ − (A ⊙ S)𝟙 ⊙ F̂) / ‖f_i‖` for a signal matrix `A` (`n × n`), with
/// `∂s_ij/∂f_i = (f̂_j − s_ij f̂_i)/‖f_i‖` the closed-form derivative of cosine similarity.
pub fn feature_direction(a: &Tensor, norms: &Tensor, fhat: &Tensor, s: &Tensor) -> Result<Tensor> {
    let af = a.matmul(fhat)?;
    let b = (a * s)?.sum_keepdim(1)?;
    Ok((af - fhat.broadcast_mul(&b)?)?.broadcast_div(norms)?)
}

/// SSR Eq. 4 with a given GraphSum matrix `G` (`n × n`): `f_i ← f_i + λ Σ_j G_ij ∂s_ij/∂f_i`
/// ([`UpdateRule::Paper`]) or `f ← f − λ ∂(Σ G ⊙ S)/∂f` ([`UpdateRule::AuthorsCode`]), for
/// the rows where `mask` (`n × 1`, 0/1) is 1.
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
        UpdateRule::AuthorsCode => ((g + g.t()?)?, -1.0),
    };
    let dir = feature_direction(&a, &norms, &fhat, &s)?;
    Ok((f + (dir.broadcast_mul(mask)? * (sign * lambda))?)?)
}

/// SSR Eq. 5: GraphSum — the MLP's outputs `g` (`n × D`) scatter-added to their positions of
/// the `n × n` matrix.
pub fn graph_sum(g: &Tensor, index: &SubgraphIndex, idx: &Tensor) -> Result<Tensor> {
    let n = index.nodes;
    let zeros = Tensor::zeros(n * n, g.dtype(), g.device())?;
    Ok(zeros
        .index_add(idx, &g.flatten_all()?, 0)?
        .reshape((n, n))?)
}

impl SsrModel {
    /// The subgraphs of the current similarities (the sort is not differentiated).
    fn subgraphs(&self, s: &Tensor) -> Result<SubgraphIndex> {
        let n = s.dims()[0];
        let sim: Vec<f64> = s
            .detach()
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        Ok(match self.task {
            Task::Retrieval { .. } => retrieval_subgraphs(&sim, n, self.config.layout),
            Task::FewShot { supports, queries } => {
                few_shot_subgraphs(&sim, supports, queries, self.config.layout)
            }
        })
    }

    /// The GraphSum matrix `G(S)` (Eqs. 2 and 5) of MLP `which` at features `f`.
    pub fn update_signal(&self, f: &Tensor, which: usize) -> Result<Tensor> {
        let (_, _, s) = cosine_graph(f)?;
        let index = self.subgraphs(&s)?;
        let idx = Tensor::from_vec(index.flat.clone(), index.flat.len(), f.device())?;
        let x = s
            .flatten_all()?
            .index_select(&idx, 0)?
            .reshape((index.nodes, index.dim))?;
        let g = self.mlps[which].forward(&x)?;
        graph_sum(&g, &index, &idx)
    }

    /// One SSR update (Eq. 4 with the learned `G`) of the rows selected by `mask`, with MLP
    /// `which`.
    pub fn step(&self, f: &Tensor, which: usize, mask: &Tensor) -> Result<Tensor> {
        let g = self.update_signal(f, which)?;
        feature_step(f, &g, mask, self.config.lambda, self.config.rule)
    }

    /// Checks the node count against the task and the features for NaN/∞; returns the rows
    /// L2-normalised (the authors normalise the features inside SSR).
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
        Ok(f.broadcast_div(&norms)?)
    }

    /// `T` SSR updates of the node features `f` (`n × d`; retrieval: row 0 the query, rows
    /// `1..=k` its references; few-shot: the support nodes then the queries), following the
    /// configured schedule. Returns the refined features.
    pub fn refine(&self, f: &Tensor) -> Result<Tensor> {
        let mut f = self.prepare(f)?;
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
        for _ in 0..self.config.steps {
            match self.config.schedule {
                GroupSchedule::Joint => f = self.step(&f, 0, &ones)?,
                GroupSchedule::Alternating => {
                    f = self.step(&f, 0, &group(true)?)?;
                    f = self.step(&f, 1, &group(false)?)?;
                }
            }
        }
        Ok(f)
    }

    /// Refined similarities `s^T(q, ·)` of the query (row 0) to its `k` references.
    pub fn refine_retrieval(&self, f: &Tensor) -> Result<Vec<f64>> {
        let r = self.refine(f)?;
        let (_, _, s) = cosine_graph(&r)?;
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
        let r = self.refine(f)?;
        let (_, _, s) = cosine_graph(&r)?;
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
        let r = self.refine(f)?;
        let (_, fhat, _) = cosine_graph(&r)?;
        let q = fhat.narrow(0, s_n, q_n)?;
        let sup = fhat.narrow(0, 0, s_n)?;
        let s = q.matmul(&sup.t()?)?;
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
    /// refined support node (`n_way` columns), row-major.
    pub fn few_shot_scores(
        &self,
        f: &Tensor,
        support_labels: &[usize],
        n_way: usize,
    ) -> Result<Vec<Vec<f64>>> {
        let s_n = support_labels.len();
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
    use crate::rerank::ssr::graph::Layout;
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
                    UpdateRule::AuthorsCode => -(g[i * n + j] + g[j * n + i]),
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
        let raw = feats(n, d, 7);
        // SSR normalises the rows first.
        let f: Vec<f64> = raw
            .chunks(d)
            .flat_map(|r| {
                let nr = r.iter().map(|x| x * x).sum::<f64>().sqrt();
                r.iter().map(move |x| x / nr).collect::<Vec<_>>()
            })
            .collect();
        for layout in [Layout::Paper, Layout::AuthorsCode] {
            for rule in [UpdateRule::Paper, UpdateRule::AuthorsCode] {
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
        for (schedule, rule) in [
            (GroupSchedule::Joint, UpdateRule::Paper),
            (GroupSchedule::Alternating, UpdateRule::AuthorsCode),
        ] {
            let mut model = tiny_model(Task::Retrieval { k }, Layout::Paper, rule, schedule);
            model.config.steps = 2;
            model.config.lambda = 0.2;
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
        let (s, q, d) = (3, 4, 5);
        let model = tiny_model(
            Task::FewShot {
                supports: s,
                queries: q,
            },
            Layout::AuthorsCode,
            UpdateRule::Paper,
            GroupSchedule::Alternating,
        );
        model.zero_update_signal().unwrap();
        let raw = feats(s + q, d, 5);
        let r = model
            .refine(&t(&raw, s + q, d))
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        for i in 0..s + q {
            let row = &raw[i * d..(i + 1) * d];
            let nr = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            for c in 0..d {
                assert!((r[i][c] - row[c] / nr).abs() < 1e-15);
            }
        }
    }
}

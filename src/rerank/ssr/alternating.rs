//! The authors' alternating update ([`UpdateRule::AuthorsCode`](super::UpdateRule) with
//! [`GroupSchedule::Alternating`](super::GroupSchedule)) as autograd computes it.
//!
//! The authors' `refine_feat` updates the two node groups in turn (retrieval: the query, then
//! the database; few-shot: the support nodes, then the queries), each with
//! `f_X ← f_X − λ ∇_{f_X} ⟨inputs, g⟩`, where `inputs` are the subgraph entries of the current
//! similarities, `g` the MLP's output on them, and the gradient is taken by
//! `torch.autograd.grad(..., create_graph=True)`. Autograd differentiates through every path
//! from the tensor `f_X` to `inputs`, and the other group's current tensor `f_Y` is itself a
//! function of `f_X`: it was produced by the previous half-step, whose gradient was taken at
//! `f_X`. So, with `V(F) = ∂⟨S(F), G⟩/∂F` the first-order direction (Eq. 4 with `G + Gᵀ`,
//! [`feature_direction`](super::update::feature_direction)) and `L_h = ∂f_Y/∂f_X` at half-step `h`,
//!
//! ```text
//! grad_h = [V_h]_X + L_hᵀ [V_h]_Y,        L_1 = 0,
//! L_h  δ = −λ ( [DV_{h−1} δ]_{X'} + L_{h−1}ᵀ [DV_{h−1} δ]_{Y'} ),
//! L_hᵀ w = −λ [ DV_{h−1}ᵀ (w + L_{h−1} w) ]_{Y'},
//! ```
//!
//! where `X', Y'` are the groups half-step `h − 1` updated and held (`X' = Y`, `Y' = X`) and
//! `DV_{h−1}` is the Jacobian of half-step `h − 1`'s direction at its own features. `L_{h−1}`
//! does not depend on `f_X` (it is the Jacobian of an earlier tensor's construction), so the
//! recursion ends at `L_1 = 0` (the first update of the first step sees two independent
//! inputs) and half-step `h` costs `h − 1` Jacobian products.
//!
//! `DV` (forward, `Linearization::jvp`) and `DVᵀ` (transposed, `Linearization::vjp`) are
//! written out: the cosine graph's derivatives, the gather and GraphSum scatter, and the
//! MLP's Jacobian (`super::model::MlpAt`). They are ordinary candle ops of the features and
//! the MLP's parameters, so meta-training differentiates through them with first-order
//! autograd, as PyTorch's `create_graph=True` does (candle has no double backward).

use super::graph::{cosine_graph, graph_sum, SubgraphIndex};
use super::model::{MlpAt, SsrModel};
use crate::error::Result;
use candle_core::Tensor;

/// Half-step `h`'s direction `V(F) = ∂⟨S(F), G(S(F))⟩/∂F` linearised at its features `F`:
/// its value and its Jacobian, forward and transposed.
pub(crate) struct Linearization<'a> {
    norms: Tensor,
    fhat: Tensor,
    s: Tensor,
    /// `A = G + Gᵀ`.
    a: Tensor,
    /// `(A ⊙ S)𝟙`.
    q: Tensor,
    /// `V(F)`.
    pub(crate) v: Tensor,
    index: SubgraphIndex,
    idx: Tensor,
    /// `∂(MLP input)/∂S`: 1, or `−2α` when the MLP reads Eq. 9's `D = 2α(1 − S) + (1 − α)J`.
    input_scale: f64,
    mlp: MlpAt<'a>,
}

impl<'a> Linearization<'a> {
    /// Linearises MLP `which`'s direction at features `f` (the fixed `jaccard` of the
    /// k-reciprocal input, if any).
    pub(crate) fn new(
        model: &'a SsrModel,
        f: &Tensor,
        which: usize,
        jaccard: Option<&Tensor>,
    ) -> Result<Self> {
        let (norms, fhat, s) = cosine_graph(f)?;
        let index = model.subgraphs(&s)?;
        let idx = Tensor::from_vec(index.flat.clone(), index.flat.len(), s.device())?;
        let x = model
            .mlp_input(&s, jaccard)?
            .flatten_all()?
            .index_select(&idx, 0)?
            .reshape((index.subgraphs, index.dim))?;
        let mlp = model.mlps[which].at(&x)?;
        let g = graph_sum(&mlp.y, &index, &idx)?;
        let a = (&g + g.t()?)?;
        let q = (&a * &s)?.sum_keepdim(1)?;
        let v = (a.matmul(&fhat)? - fhat.broadcast_mul(&q)?)?.broadcast_div(&norms)?;
        Ok(Linearization {
            norms,
            fhat,
            s,
            a,
            q,
            v,
            index,
            idx,
            input_scale: model.input_scale(),
            mlp,
        })
    }

    /// The subgraph entries of an `n × n` matrix (`subgraphs × D`).
    fn gather(&self, m: &Tensor) -> Result<Tensor> {
        Ok(m.flatten_all()?
            .index_select(&self.idx, 0)?
            .reshape((self.index.subgraphs, self.index.dim))?)
    }

    /// `DV δ`: the change of the direction for a change `δ` (`n × d`) of the features.
    pub(crate) fn jvp(&self, delta: &Tensor) -> Result<Tensor> {
        let (fhat, norms) = (&self.fhat, &self.norms);
        // The unit rows and the norms: df̂ = (δ − f̂ (f̂·δ)) / ‖f‖, d‖f‖ = f̂·δ.
        let dr = (fhat * delta)?.sum_keepdim(1)?;
        let dfhat = (delta - fhat.broadcast_mul(&dr)?)?.broadcast_div(norms)?;
        let half = dfhat.matmul(&fhat.t()?)?;
        let ds = (&half + half.t()?)?;
        // Through the MLP: dG = scatter(J gather(dS)).
        let dx = (self.gather(&ds)? * self.input_scale)?;
        let dg = graph_sum(&self.mlp.jvp(&dx)?, &self.index, &self.idx)?;
        let da = (&dg + dg.t()?)?;
        // V = P / ‖f‖ with P = A F̂ − q ⊙ F̂ and q = (A ⊙ S)𝟙.
        let dq = ((&da * &self.s)? + (&self.a * &ds)?)?.sum_keepdim(1)?;
        let dp = (((da.matmul(fhat)? + self.a.matmul(&dfhat)?)? - fhat.broadcast_mul(&dq)?)?
            - dfhat.broadcast_mul(&self.q)?)?;
        Ok((dp - self.v.broadcast_mul(&dr)?)?.broadcast_div(norms)?)
    }

    /// `DVᵀ w`: the feature cotangent of a direction cotangent `w` (`n × d`).
    pub(crate) fn vjp(&self, w: &Tensor) -> Result<Tensor> {
        let (fhat, norms) = (&self.fhat, &self.norms);
        // V = P / ‖f‖.
        let pbar = w.broadcast_div(norms)?;
        let rbar = ((w * &self.v)?.sum_keepdim(1)?.neg()? / norms)?;
        // P = A F̂ − q ⊙ F̂ (A is symmetric).
        let mut fhat_bar = (self.a.matmul(&pbar)? - pbar.broadcast_mul(&self.q)?)?;
        let qbar = (&pbar * fhat)?.sum_keepdim(1)?.neg()?;
        // q = (A ⊙ S)𝟙.
        let abar = (pbar.matmul(&fhat.t()?)? + self.s.broadcast_mul(&qbar)?)?;
        let mut sbar = self.a.broadcast_mul(&qbar)?;
        // A = G + Gᵀ, G = scatter(MLP(gather(input(S)))).
        let gbar = self.gather(&(&abar + abar.t()?)?)?;
        let xbar = (self.mlp.vjp(&gbar)? * self.input_scale)?;
        sbar = (sbar + graph_sum(&xbar, &self.index, &self.idx)?)?;
        // S = F̂F̂ᵀ, F̂ = F / ‖F‖.
        fhat_bar = (fhat_bar + (&sbar + sbar.t()?)?.matmul(fhat)?)?;
        let radial = (fhat * &fhat_bar)?.sum_keepdim(1)?;
        let tangent = (fhat_bar - fhat.broadcast_mul(&radial)?)?.broadcast_div(norms)?;
        Ok((tangent + fhat.broadcast_mul(&rbar)?)?)
    }
}

/// One finished half-step: its linearisation and its groups (`n × 1` masks).
pub(crate) struct HalfStep<'a> {
    pub(crate) at: Linearization<'a>,
    /// The rows it updated.
    pub(crate) updated: Tensor,
    /// The rows it held.
    pub(crate) held: Tensor,
}

/// `L_hᵀ w` for the half-step after `chain` (its predecessors, oldest first): the pull-back
/// of a cotangent `w` on the rows the last of them updated to the rows it held. `None` is 0.
pub(crate) fn pull_back(chain: &[HalfStep], w: &Tensor, lambda: f64) -> Result<Option<Tensor>> {
    let Some((last, earlier)) = chain.split_last() else {
        return Ok(None);
    };
    let z = match push_forward(earlier, w, lambda)? {
        Some(lw) => (w + lw)?,
        None => w.clone(),
    };
    Ok(Some(
        (last.at.vjp(&z)?.broadcast_mul(&last.held)? * -lambda)?,
    ))
}

/// `L_h δ` for the half-step after `chain`: the change of the rows the last of them updated
/// for a change `δ` of the rows it held. `None` is 0.
pub(crate) fn push_forward(
    chain: &[HalfStep],
    delta: &Tensor,
    lambda: f64,
) -> Result<Option<Tensor>> {
    let Some((last, earlier)) = chain.split_last() else {
        return Ok(None);
    };
    let u = last.at.jvp(delta)?;
    let mut out = u.broadcast_mul(&last.updated)?;
    if let Some(back) = pull_back(earlier, &u.broadcast_mul(&last.held)?, lambda)? {
        out = (out + back)?;
    }
    Ok(Some((out * -lambda)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rerank::ssr::graph::Layout;
    use crate::rerank::ssr::graph::Task;
    use crate::rerank::ssr::model::{GroupSchedule, SsrConfig, SsrInput, UpdateRule};
    use candle_core::{DType, Device};
    use candle_nn::Module;

    /// Deterministic values in [-1, 1].
    fn values(len: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect()
    }

    fn mat(v: Vec<f64>, r: usize, c: usize) -> Tensor {
        Tensor::from_vec(v, (r, c), &Device::Cpu).unwrap()
    }

    fn flat(t: &Tensor) -> Vec<f64> {
        t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
    }

    fn dot(a: &Tensor, b: &Tensor) -> f64 {
        flat(a).iter().zip(flat(b)).map(|(x, y)| x * y).sum()
    }

    /// Raw features of norms between 1 and 5.
    fn raw(n: usize, d: usize, seed: u64) -> Tensor {
        let v = values(n * d, seed);
        let scale = values(n, seed + 1);
        let rows: Vec<f64> = v
            .chunks(d)
            .zip(&scale)
            .flat_map(|(r, s)| r.iter().map(move |x| x * (3.0 + 2.0 * s)))
            .collect();
        mat(rows, n, d)
    }

    /// A model with random (not zero-initialised) MLPs and non-trivial InstanceNorm affines.
    fn model(task: Task, input: SsrInput) -> SsrModel {
        let config = SsrConfig {
            hidden: 7,
            steps: 2,
            lambda: 0.1,
            layout: Layout::AuthorsCode,
            rule: UpdateRule::AuthorsCode,
            schedule: GroupSchedule::Alternating,
            input,
            ..SsrConfig::default()
        };
        let m = SsrModel::new(config, task, DType::F64, 11).unwrap();
        for (i, (name, var)) in m.vars().into_iter().enumerate() {
            if name.contains(".in") {
                let base = if name.ends_with("weight") { 1.0 } else { 0.0 };
                let v = base + 0.3 * values(1, 40 + i as u64)[0];
                var.set(&Tensor::from_vec(vec![v], 1, &Device::Cpu).unwrap())
                    .unwrap();
            }
        }
        m
    }

    /// Central differences of `f` along `dir` (step `h`).
    fn directional(f: impl Fn(&Tensor) -> Tensor, at: &Tensor, dir: &Tensor, h: f64) -> Tensor {
        let plus = f(&(at + (dir * h).unwrap()).unwrap());
        let minus = f(&(at - (dir * h).unwrap()).unwrap());
        ((plus - minus).unwrap() / (2.0 * h)).unwrap()
    }

    fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
        let (a, b) = (flat(a), flat(b));
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert!(scale > 1e-8, "{what}: the expected values are all zero");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= tol * scale,
                "{what}[{i}]: {x} vs {y} (scale {scale})"
            );
        }
    }

    #[test]
    fn mlp_jacobian_matches_finite_differences_and_its_transpose() {
        let m = model(
            Task::FewShot {
                supports: 2,
                queries: 3,
            },
            SsrInput::Similarity,
        );
        let mlp = &m.mlps[1];
        let dim = m.task.input_dim(&m.config).unwrap();
        let x = mat(values(4 * dim, 3), 4, dim);
        let at = mlp.at(&x).unwrap();
        assert_close(&at.y, &mlp.forward(&x).unwrap(), 1e-14, "output");
        let dx = mat(values(4 * dim, 4), 4, dim);
        let fd = directional(|x| mlp.forward(x).unwrap(), &x, &dx, 1e-6);
        assert_close(&at.jvp(&dx).unwrap(), &fd, 1e-7, "J dx");
        let gy = mat(values(4 * dim, 5), 4, dim);
        let lhs = dot(&gy, &at.jvp(&dx).unwrap());
        let rhs = dot(&at.vjp(&gy).unwrap(), &dx);
        assert!(
            (lhs - rhs).abs() < 1e-12 * lhs.abs().max(1.0),
            "{lhs} vs {rhs}"
        );
    }

    #[test]
    fn direction_jacobian_matches_finite_differences_and_its_transpose() {
        // Retrieval and few-shot graphs, the similarity input and Eq. 9's (input scale −2α).
        let cases = [
            (Task::Retrieval { k: 5 }, SsrInput::Similarity),
            (
                Task::FewShot {
                    supports: 3,
                    queries: 4,
                },
                SsrInput::Similarity,
            ),
            (
                Task::Retrieval { k: 6 },
                SsrInput::KReciprocal {
                    alpha: 0.4,
                    k1: 3,
                    k2: 2,
                },
            ),
        ];
        for (task, input) in cases {
            let m = model(task, input);
            let n = task.nodes();
            let d = 4;
            let f = raw(n, d, 7);
            let jaccard = m.fixed_jaccard(&f).unwrap();
            for which in 0..2 {
                let at = Linearization::new(&m, &f, which, jaccard.as_ref()).unwrap();
                let v_of = |f: &Tensor| {
                    Linearization::new(&m, f, which, jaccard.as_ref())
                        .unwrap()
                        .v
                };
                // V is the first-order direction of Eq. 4 with G + Gᵀ.
                let (norms, fhat, s) = cosine_graph(&f).unwrap();
                let g = m.update_signal(&s, jaccard.as_ref(), which).unwrap();
                let a = (&g + g.t().unwrap()).unwrap();
                let v =
                    crate::rerank::ssr::update::feature_direction(&a, &norms, &fhat, &s).unwrap();
                assert_close(&at.v, &v, 1e-13, "V");
                // Small steps keep the subgraphs' sort (the sort is not differentiated).
                let delta = mat(values(n * d, 8 + which as u64), n, d);
                let fd = directional(v_of, &f, &delta, 1e-6);
                assert_close(&at.jvp(&delta).unwrap(), &fd, 1e-6, "DV δ");
                let w = mat(values(n * d, 9), n, d);
                let lhs = dot(&w, &at.jvp(&delta).unwrap());
                let rhs = dot(&at.vjp(&w).unwrap(), &delta);
                assert!(
                    (lhs - rhs).abs() < 1e-11 * lhs.abs().max(1.0),
                    "{task:?} {input:?}: ⟨w, DV δ⟩ {lhs} vs ⟨DVᵀ w, δ⟩ {rhs}"
                );
            }
        }
    }

    #[test]
    fn the_second_update_is_the_total_derivative_through_the_first() {
        // One step: the database update's gradient, read off the refined features, against
        // central differences of ⟨S(q₁(d), d), G₂⟩ over every database entry, where q₁(d) is the
        // query's first-order update at database d, and G₂ (the MLP's output) and the
        // subgraphs are held at the point of the second update (autograd's `grad_outputs`).
        let k = 4;
        let task = Task::Retrieval { k };
        let mut m = model(task, SsrInput::Similarity);
        m.config.steps = 1;
        let (n, d) = (k + 1, 3);
        let lambda = m.config.lambda;
        let f0 = raw(n, d, 21);
        let query = mat(
            (0..n).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect(),
            n,
            1,
        );
        let database = (1.0 - &query).unwrap();
        let f1 = m.step(&f0, 0, &query, None).unwrap();
        let f2 = m.refine(&f0).unwrap();
        let grad = ((&f1 - &f2).unwrap() / lambda).unwrap();
        let s1 = cosine_graph(&f1).unwrap().2;
        let g2 = m.update_signal(&s1, None, 1).unwrap();
        let phi = |f: &Tensor| -> f64 {
            let stepped = m.step(f, 0, &query, None).unwrap();
            dot(&cosine_graph(&stepped).unwrap().2, &g2)
        };
        let base = flat(&f0);
        let h = 1e-6;
        let mut fd = vec![0.0; n * d];
        for e in d..n * d {
            let mut p = base.clone();
            p[e] += h;
            let mut q = base.clone();
            q[e] -= h;
            fd[e] = (phi(&mat(p, n, d)) - phi(&mat(q, n, d))) / (2.0 * h);
        }
        let got = flat(&grad.broadcast_mul(&database).unwrap());
        let first_order = flat(
            &Linearization::new(&m, &f1, 1, None)
                .unwrap()
                .v
                .broadcast_mul(&database)
                .unwrap(),
        );
        let scale = fd.iter().fold(0f64, |a, x| a.max(x.abs()));
        let mut extra = 0f64;
        for e in d..n * d {
            assert!(
                (got[e] - fd[e]).abs() < 1e-7 * scale,
                "[{e}]: {} vs finite differences {}",
                got[e],
                fd[e]
            );
            extra = extra.max((first_order[e] - fd[e]).abs());
        }
        // The path through the query's update is not negligible here.
        assert!(extra > 1e-4 * scale, "the second-order term is {extra}");
    }
}

//! k-reciprocal re-ranking (Zhong, Zheng, Cao, Li, "Re-ranking Person Re-identification with
//! k-reciprocal Encoding", CVPR 2017), the "k-reciprocal" baseline of SSR Tables 1 and 2 and the
//! Jaccard term of SSR Eq. (9), computed exactly as the `re_ranking` code SSR uses
//! (`k_reciprocal.py`, adapted from `zhunzhong07/person-re-ranking`).
//!
//! Over the node set of queries and references (the method needs reference–reference
//! neighbourhoods), with `d(i, j)` the squared Euclidean distance of L2-normalised features:
//!
//! 1. **Original distance** `o(i, j) = d(i, j) / max_a d(a, i)` (the code divides each column by
//!    its maximum, then transposes) and the initial ranking of every node by `o`.
//! 2. **k-reciprocal set** (SSR Eq. 8): `R(i, k) = {j ∈ top(i, k+1) : i ∈ top(j, k+1)}` (the
//!    node itself counts among its own `k + 1` nearest).
//! 3. **Expansion**: `R*(i) = R(i, k1) ∪ R(c, round(k1/2))` for every `c ∈ R(i, k1)` whose
//!    half-size set overlaps `R(i, k1)` in strictly more than 2/3 of its elements.
//! 4. **Gaussian-kernel encoding**: `V[i, j] = exp(−o(i, j)) / Σ_{j' ∈ R*(i)} exp(−o(i, j'))` on
//!    `R*(i)`, 0 elsewhere.
//! 5. **Local query expansion** (if `k2 ≠ 1`): `V[i] ← mean of V[m]` over the `k2` nodes `m`
//!    ranked first for `i` (itself included).
//! 6. **Jaccard distance** through the min/max formulation with `Σ max = 2 − Σ min` (rows sum
//!    to 1): `d_J(i, j) = 1 − Σ_k min(V_ik, V_jk) / (2 − Σ_k min(V_ik, V_jk))`.
//! 7. **Final distance** `(1 − λ) · d_J(i, j) + λ · o(i, j)` (SSR Eq. 9 with `α = λ`).
//!
//! Defaults: `k1 = 20, k2 = 6, λ = 0.3` ("the org paper"); SSR's landmark grid is
//! `k1 ∈ {40, 80, 160}, k2 = k1/2, λ ∈ {0.1, 0.3, 0.5}` and its few-shot grid
//! `k1 ∈ {10, 20, 30}, k2 ∈ {5, 10, 15}, λ ∈ {0.2, 0.5, 0.8}`.
//!
//! # Memory
//!
//! The reference code holds dense `(Q+G)²` matrices (`original_dist`, `V`, `initial_rank`):
//! 14 GB each in f32 at SOP scale. [`KReciprocal::fit`] computes the same distances with the
//! ranking lists cut to the `max(k1 + 1, k2)` nearest (the exact kNN engine), `V` as sparse
//! rows with its inverted index, and the `Q × G` result produced a chunk of queries at a time:
//! memory `O((Q+G) · (k1 + nnz(V)/row) + chunk · G)`, time dominated by the `(Q+G)²·D` kNN. The
//! dense transcription, [`KReciprocal::distances_from_matrices`], takes the three distance
//! matrices as the reference does and costs `O((Q+G)²)` memory; it is meant for small problems
//! (few-shot episodes) and for checking the sparse path.
//!
//! # Ties
//!
//! The reference sorts with numpy's `argsort` (introsort: unspecified order on equal
//! distances); here ties are broken by node index. Results differ only where distances tie
//! exactly (duplicate features).

pub mod classifier;

pub use classifier::{best_of_grid, ssr_fewshot_grid, KReciprocalClassifier, SSR_FEWSHOT_GRID};

use super::{check_chunk, cosine_chunk, Reranker};
use crate::error::{Error, Result};
use crate::retrieval::{knn, prepare, SelfMatch, Similarity};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// Parameters of k-reciprocal re-ranking (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KReciprocal {
    /// Size of the k-reciprocal neighbourhood `R(i, k1)`.
    pub k1: usize,
    /// Number of neighbours averaged by the local query expansion (1 = none).
    pub k2: usize,
    /// Weight `λ` of the original distance in the final distance (SSR Eq. 9's `α`).
    pub lambda: f64,
}

impl Default for KReciprocal {
    /// Zhong et al.'s setting, the default of SSR's scripts: `k1 = 20, k2 = 6, λ = 0.3`.
    fn default() -> Self {
        KReciprocal {
            k1: 20,
            k2: 6,
            lambda: 0.3,
        }
    }
}

impl KReciprocal {
    /// Errors naming the parameter unless `k1 ≥ 1`, `1 ≤ k2`, `k1 + 1 ≤ nodes`, `k2 ≤ nodes`
    /// and `0 ≤ λ ≤ 1` (`nodes` = queries + references).
    pub fn validate(&self, nodes: usize) -> Result<()> {
        if self.k1 == 0 || self.k1 >= nodes {
            return Err(Error::invalid(
                "k1",
                format!(
                    "must be between 1 and {} (the {nodes} query and reference nodes less the \
                     node itself), got {}",
                    nodes.saturating_sub(1),
                    self.k1
                ),
            ));
        }
        if self.k2 == 0 || self.k2 > nodes {
            return Err(Error::invalid(
                "k2",
                format!(
                    "must be between 1 and {nodes} (the query and reference nodes), got {}",
                    self.k2
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.lambda) {
            return Err(Error::invalid(
                "lambda",
                format!("must be in [0, 1], got {}", self.lambda),
            ));
        }
        Ok(())
    }

    /// Number of neighbours of each node the method reads: `max(k1 + 1, k2)`.
    fn width(&self) -> usize {
        (self.k1 + 1).max(self.k2)
    }

    /// The dense transcription of the reference `re_ranking(q_g_dist, q_q_dist, g_g_dist, k1,
    /// k2, lambda)`: inputs are **Euclidean** (not squared) distances, row-major,
    /// query × reference (`nq × ng`), query × query and reference × reference; the result is the
    /// `nq × ng` final distance, row-major. Memory `O((nq + ng)²)`.
    ///
    /// Errors on wrong matrix sizes, non-finite or negative distances, bad parameters, or a
    /// node whose distances to all nodes are 0 (the column normalisation would divide by 0).
    pub fn distances_from_matrices(
        &self,
        q_g: &[f64],
        q_q: &[f64],
        g_g: &[f64],
        nq: usize,
        ng: usize,
    ) -> Result<Vec<f64>> {
        for (name, m, len) in [
            ("q_g", q_g, nq * ng),
            ("q_q", q_q, nq * nq),
            ("g_g", g_g, ng * ng),
        ] {
            if m.len() != len {
                return Err(Error::Shape(format!(
                    "{name} has {} entries, expected {len} for {nq} queries and {ng} references",
                    m.len()
                )));
            }
            if let Some(p) = m.iter().position(|v| !v.is_finite() || *v < 0.0) {
                return Err(Error::invalid(
                    name,
                    format!("entry {p} is {}, not a finite distance ≥ 0", m[p]),
                ));
            }
        }
        let n = nq + ng;
        self.validate(n)?;
        // The assembled (Q+G)² matrix of squared distances, [[q_q, q_g], [q_gᵀ, g_g]].
        let sq = |i: usize, j: usize| -> f64 {
            let d = match (i < nq, j < nq) {
                (true, true) => q_q[i * nq + j],
                (true, false) => q_g[i * ng + (j - nq)],
                (false, true) => q_g[j * ng + (i - nq)],
                (false, false) => g_g[(i - nq) * ng + (j - nq)],
            };
            d * d
        };
        let col_max: Vec<f64> = (0..n)
            .map(|c| (0..n).map(|a| sq(a, c)).fold(0.0, f64::max))
            .collect();
        if let Some(c) = col_max.iter().position(|&m| m == 0.0) {
            return Err(Error::invalid(
                "distances",
                format!(
                    "node {c} is at distance 0 from every node; the distances cannot be normalised"
                ),
            ));
        }
        // o(i, j) = d(j, i)² / max_a d(a, i)²: column normalisation, then the transpose.
        let original: Vec<f64> = (0..n * n)
            .map(|p| {
                let (i, j) = (p / n, p % n);
                sq(j, i) / col_max[i]
            })
            .collect();
        let v = self.encode_dense(&original, n);
        let inverted = v.transpose(n);
        let mut acc = vec![0.0; n];
        let mut touched = Vec::new();
        let mut out = Vec::with_capacity(nq * ng);
        for i in 0..nq {
            min_overlap(&v, &inverted, i, &mut acc, &mut touched);
            for g in 0..ng {
                let j = nq + g;
                out.push(self.combine(jaccard(acc[j]), original[i * n + j]));
            }
            clear(&mut acc, &mut touched);
        }
        Ok(out)
    }

    /// Steps 1–5 on a dense `n × n` matrix of normalised original distances `o`: the ranking
    /// of every node and its encoding `V`.
    fn encode_dense(&self, original: &[f64], n: usize) -> SparseRows {
        let width = self.width();
        let ranks: Vec<u32> = original
            .par_chunks(n)
            .flat_map_iter(|row| {
                let mut order: Vec<u32> = (0..n as u32).collect();
                order.sort_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]));
                order.truncate(width);
                order
            })
            .collect();
        encode(self, &ranks, width, |i, j| original[i * n + j])
    }

    /// The Jaccard distances `d_J(i, j)` (step 6) between every pair of **one** node set, from
    /// their cosine similarities `cos` (`n × n`, row-major): the `J` of SSR's Eq. 9 input
    /// `D = 2α(1 − S) + (1 − α)J` over a graph's nodes (Sec. 2.3). `λ` is not used (it only
    /// weighs the final distance). Dense, `O(n²)` memory: meant for one graph.
    ///
    /// Errors on a matrix of another size, non-finite entries, bad `k1`/`k2` for `n` nodes, or
    /// a node whose distances to every node are 0.
    pub fn jaccard_from_similarities(&self, cos: &[f64], n: usize) -> Result<Vec<f64>> {
        if cos.len() != n * n {
            return Err(Error::Shape(format!(
                "{} similarities for {n} nodes ({} expected)",
                cos.len(),
                n * n
            )));
        }
        if let Some(p) = cos.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "similarities",
                format!("entry {p} is {}", cos[p]),
            ));
        }
        self.validate(n)?;
        // d(i, j) = ‖f̂_i − f̂_j‖² = 2 − 2 cos, then the reference's column normalisation.
        let sq = |i: usize, j: usize| (2.0 - 2.0 * cos[i * n + j]).max(0.0);
        let col_max: Vec<f64> = (0..n)
            .map(|c| (0..n).map(|a| sq(a, c)).fold(0.0, f64::max))
            .collect();
        if let Some(c) = col_max.iter().position(|&m| m == 0.0) {
            return Err(Error::invalid(
                "similarities",
                format!(
                    "node {c} is at distance 0 from every node; the distances cannot be normalised"
                ),
            ));
        }
        let original: Vec<f64> = (0..n * n)
            .map(|p| {
                let (i, j) = (p / n, p % n);
                sq(j, i) / col_max[i]
            })
            .collect();
        let v = self.encode_dense(&original, n);
        let inverted = v.transpose(n);
        let mut acc = vec![0.0; n];
        let mut touched = Vec::new();
        let mut out = Vec::with_capacity(n * n);
        for i in 0..n {
            min_overlap(&v, &inverted, i, &mut acc, &mut touched);
            out.extend(acc.iter().map(|&m| jaccard(m)));
            clear(&mut acc, &mut touched);
        }
        Ok(out)
    }

    /// `(1 − λ) · d_J + λ · o`.
    fn combine(&self, jaccard: f64, original: f64) -> f64 {
        (1.0 - self.lambda) * jaccard + self.lambda * original
    }

    /// Prepares k-reciprocal re-ranking of `queries` against `references` (or against
    /// themselves, each query removed from its own list, when `references` is `None`), from
    /// features; they are L2-normalised, so `d(i, j) = ‖f̂_i − f̂_j‖² = 2 − 2 cos(i, j)`, as the
    /// reference's Euclidean distances between normalised features (SSR Eq. 9).
    ///
    /// The node set is `[queries; references]`, or the references alone when they are the
    /// queries (no duplicated nodes). Errors on bad features or parameters (see
    /// [`KReciprocal::validate`]), or when all features are identical.
    pub fn fit(&self, queries: &Tensor, references: Option<&Tensor>) -> Result<KReciprocalRanking> {
        let refs = references.unwrap_or(queries);
        let ops = prepare(queries, refs, Similarity::Cosine, &Device::Cpu)?;
        let (nq, nr) = (ops.num_queries, ops.num_references);
        let nodes = match references {
            Some(_) => Tensor::cat(&[&ops.queries, &ops.references], 0)?,
            None => ops.references.clone(),
        };
        let n = nodes.dims()[0];
        self.validate(n)?;
        let width = self.width();
        let neighbours = knn(&nodes, &nodes, width, SelfMatch::None, 128)?;
        // max_a d(a, i) = 2 − 2 min_a cos(a, i); the best match against the negated nodes
        // gives −min_a cos(a, i) with the same exact engine.
        let farthest = knn(&nodes, &nodes.neg()?, 1, SelfMatch::None, 128)?;
        let max_sq: Vec<f64> = farthest
            .scores
            .iter()
            .map(|&s| (2.0 + 2.0 * s as f64).max(0.0))
            .collect();
        if let Some(i) = max_sq.iter().position(|&m| m == 0.0) {
            return Err(Error::invalid(
                "features",
                format!("node {i} has the same direction as every node; the distances cannot be normalised"),
            ));
        }
        let flat: Vec<f32> = nodes.flatten_all()?.to_vec1::<f32>()?;
        let dim = nodes.dims()[1];
        let original = |i: usize, j: usize| -> f64 {
            let (a, b) = (&flat[i * dim..(i + 1) * dim], &flat[j * dim..(j + 1) * dim]);
            let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
            (2.0 - 2.0 * dot).max(0.0) / max_sq[i]
        };
        let v = encode(self, &neighbours.indices, width, original);
        let inverted = v.transpose(n);
        Ok(KReciprocalRanking {
            params: *self,
            queries: ops.queries,
            references: ops.references,
            num_queries: nq,
            num_references: nr,
            same: references.is_none(),
            max_sq,
            v,
            inverted,
        })
    }
}

/// Rounds `k1 / 2` half to even, as `int(np.around(k1 / 2.))` does.
fn half_k(k1: usize) -> usize {
    let h = k1 / 2;
    if k1 % 2 == 1 && h % 2 == 1 {
        h + 1
    } else {
        h
    }
}

/// `R(i, k)` (SSR Eq. 8) in the order of `i`'s ranking: the nodes among `i`'s `k + 1` nearest
/// that have `i` among their own `k + 1` nearest. `ranks` is `n × width`, `k < width`.
fn reciprocal_set(ranks: &[u32], width: usize, i: usize, k: usize) -> Vec<u32> {
    let top = |a: usize| &ranks[a * width..a * width + k + 1];
    top(i)
        .iter()
        .copied()
        .filter(|&c| top(c as usize).contains(&(i as u32)))
        .collect()
}

/// `R*(i)`: `R(i, k1)` expanded with the `round(k1/2)`-reciprocal sets of its members that share
/// strictly more than 2/3 of their elements with it; sorted, without duplicates.
fn expanded_set(ranks: &[u32], width: usize, i: usize, k1: usize) -> Vec<u32> {
    let base = reciprocal_set(ranks, width, i, k1);
    let half = half_k(k1);
    let mut set = base.clone();
    for &c in &base {
        let candidate = reciprocal_set(ranks, width, c as usize, half);
        let shared = candidate.iter().filter(|x| base.contains(x)).count();
        // The reference's float test `len(∩) > 2./3 * len(candidate)`, evaluated the same way.
        if shared as f64 > 2.0 / 3.0 * candidate.len() as f64 {
            set.extend_from_slice(&candidate);
        }
    }
    set.sort_unstable();
    set.dedup();
    set
}

/// Sparse rows (compressed sparse row): row `i` is `cols/vals[offsets[i]..offsets[i + 1]]`,
/// columns increasing.
#[derive(Debug, Clone, PartialEq)]
struct SparseRows {
    offsets: Vec<usize>,
    cols: Vec<u32>,
    vals: Vec<f64>,
}

impl SparseRows {
    fn from_rows(rows: Vec<Vec<(u32, f64)>>) -> Self {
        let mut offsets = Vec::with_capacity(rows.len() + 1);
        offsets.push(0);
        let nnz: usize = rows.iter().map(Vec::len).sum();
        let (mut cols, mut vals) = (Vec::with_capacity(nnz), Vec::with_capacity(nnz));
        for row in rows {
            for (c, v) in row {
                cols.push(c);
                vals.push(v);
            }
            offsets.push(cols.len());
        }
        SparseRows {
            offsets,
            cols,
            vals,
        }
    }

    fn row(&self, i: usize) -> (&[u32], &[f64]) {
        let r = self.offsets[i]..self.offsets[i + 1];
        (&self.cols[r.clone()], &self.vals[r])
    }

    /// The transpose (the reference's inverted index `invIndex`, with the values), `n` columns.
    fn transpose(&self, n: usize) -> SparseRows {
        let mut rows: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
        for i in 0..self.offsets.len() - 1 {
            let (cols, vals) = self.row(i);
            for (&c, &v) in cols.iter().zip(vals) {
                rows[c as usize].push((i as u32, v));
            }
        }
        SparseRows::from_rows(rows)
    }
}

/// Steps 2–5: the k-reciprocal encoding `V` of every node, after the local query expansion.
/// `ranks` is `n × width` (each node's nearest first, itself included); `original(i, j)` is the
/// normalised original distance `o(i, j)`.
fn encode(
    params: &KReciprocal,
    ranks: &[u32],
    width: usize,
    original: impl Fn(usize, usize) -> f64 + Sync,
) -> SparseRows {
    let n = ranks.len() / width;
    let v: Vec<Vec<(u32, f64)>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let set = expanded_set(ranks, width, i, params.k1);
            let weights: Vec<f64> = set
                .iter()
                .map(|&j| (-original(i, j as usize)).exp())
                .collect();
            let total: f64 = weights.iter().sum();
            set.into_iter()
                .zip(weights)
                .map(|(j, w)| (j, w / total))
                .collect()
        })
        .collect();
    if params.k2 == 1 {
        return SparseRows::from_rows(v);
    }
    let k2 = params.k2;
    let expanded: Vec<Vec<(u32, f64)>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let mut entries: Vec<(u32, f64)> = ranks[i * width..i * width + k2]
                .iter()
                .flat_map(|&m| v[m as usize].iter().copied())
                .collect();
            entries.sort_by_key(|e| e.0);
            let mut row: Vec<(u32, f64)> = Vec::with_capacity(entries.len());
            for (c, x) in entries {
                match row.last_mut() {
                    Some(last) if last.0 == c => last.1 += x,
                    _ => row.push((c, x)),
                }
            }
            for e in &mut row {
                e.1 /= k2 as f64;
            }
            row
        })
        .collect();
    SparseRows::from_rows(expanded)
}

/// Accumulates `Σ_k min(V_ik, V_jk)` into `acc[j]` for every node `j` sharing a non-zero
/// column with `i`, recording the touched `j` (the reference's `temp_min` loop).
fn min_overlap(
    v: &SparseRows,
    inverted: &SparseRows,
    i: usize,
    acc: &mut [f64],
    touched: &mut Vec<u32>,
) {
    let (cols, vals) = v.row(i);
    for (&k, &vik) in cols.iter().zip(vals) {
        let (rows, vjk) = inverted.row(k as usize);
        for (&j, &x) in rows.iter().zip(vjk) {
            if acc[j as usize] == 0.0 {
                touched.push(j);
            }
            acc[j as usize] += vik.min(x);
        }
    }
}

/// Resets the touched entries of `acc` to 0.
fn clear(acc: &mut [f64], touched: &mut Vec<u32>) {
    for &j in touched.iter() {
        acc[j as usize] = 0.0;
    }
    touched.clear();
}

/// Jaccard distance from `Σ min`: `1 − m / (2 − m)` (`Σ max = 2 − Σ min`).
fn jaccard(sum_min: f64) -> f64 {
    1.0 - sum_min / (2.0 - sum_min)
}

/// k-reciprocal re-ranking prepared on a set of features by [`KReciprocal::fit`]: the sparse
/// encoding of every node and what is needed to produce the final distances of any chunk of
/// queries.
pub struct KReciprocalRanking {
    params: KReciprocal,
    queries: Tensor,
    references: Tensor,
    num_queries: usize,
    num_references: usize,
    same: bool,
    /// `max_a d(a, i)` per node.
    max_sq: Vec<f64>,
    v: SparseRows,
    inverted: SparseRows,
}

impl KReciprocalRanking {
    /// The node of reference `r`.
    fn reference_node(&self, r: usize) -> usize {
        if self.same {
            r
        } else {
            self.num_queries + r
        }
    }

    /// Final distances (step 7) of queries `start..start + len` to every reference,
    /// row-major `len × G`.
    pub fn distances(&self, start: usize, len: usize) -> Result<Vec<f64>> {
        check_chunk(self, start, len)?;
        let cos = cosine_chunk(&self.queries, &self.references, start, len)?;
        let nr = self.num_references;
        let n = self.max_sq.len();
        let mut out = vec![0.0; len * nr];
        out.par_chunks_mut(nr)
            .zip(cos.par_chunks(nr))
            .enumerate()
            .for_each_init(
                || (vec![0.0; n], Vec::new()),
                |(acc, touched), (r, (row, cos_row))| {
                    let i = start + r;
                    min_overlap(&self.v, &self.inverted, i, acc, touched);
                    for (g, (o, &c)) in row.iter_mut().zip(cos_row).enumerate() {
                        let original = (2.0 - 2.0 * c as f64).max(0.0) / self.max_sq[i];
                        *o = self
                            .params
                            .combine(jaccard(acc[self.reference_node(g)]), original);
                    }
                    clear(acc, touched);
                },
            );
        Ok(out)
    }

    /// The parameters.
    pub fn params(&self) -> KReciprocal {
        self.params
    }
}

impl Reranker for KReciprocalRanking {
    fn num_queries(&self) -> usize {
        self.num_queries
    }
    fn num_references(&self) -> usize {
        self.num_references
    }
    fn queries_are_references(&self) -> bool {
        self.same
    }
    /// The negated final distances.
    fn scores(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        Ok(self
            .distances(start, len)?
            .into_iter()
            .map(|d| -d as f32)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_k_rounds_half_to_even_like_numpy() {
        let got: Vec<usize> = (1..=10).map(half_k).collect();
        assert_eq!(got, vec![0, 1, 2, 2, 2, 3, 4, 4, 4, 5]);
    }

    /// Six points on a line, two clusters {0, 1, 2} at 0, 1, 2.5 and {3, 4, 5} at 10, 11, 12.5;
    /// k1 = 2, worked by hand in the comments.
    fn line() -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let x: [f64; 6] = [0.0, 1.0, 2.5, 10.0, 11.0, 12.5];
        let d = |i: usize, j: usize| x[i] - x[j];
        let abs = |i, j| d(i, j).abs();
        // Query = node 0, references = nodes 1..6.
        let q_g = (1..6).map(|j| abs(0, j)).collect();
        let q_q = vec![0.0];
        let g_g = (1..6)
            .flat_map(|i| (1..6).map(move |j| (i, j)))
            .map(|(i, j)| abs(i, j))
            .collect();
        (q_g, q_q, g_g)
    }

    #[test]
    fn hand_worked_sets_on_a_line() {
        // Nearest three (itself first) by squared distance:
        // 0: [0, 1, 2]; 1: [1, 0, 2]; 2: [2, 1, 0]; 3: [3, 4, 5]; 4: [4, 3, 5]; 5: [5, 4, 3].
        let ranks: Vec<u32> = vec![0, 1, 2, 1, 0, 2, 2, 1, 0, 3, 4, 5, 4, 3, 5, 5, 4, 3];
        // Every node of a cluster has the others among its 3 nearest: R(i, 2) = its cluster.
        assert_eq!(reciprocal_set(&ranks, 3, 0, 2), vec![0, 1, 2]);
        assert_eq!(reciprocal_set(&ranks, 3, 5, 2), vec![5, 4, 3]);
        // With 2 nearest: 2's list is [2, 1] but 1's is [1, 0], so R(2, 1) = {2}.
        assert_eq!(reciprocal_set(&ranks, 3, 2, 1), vec![2]);
        assert_eq!(reciprocal_set(&ranks, 3, 1, 1), vec![1, 0]);
        // Expansion adds nothing outside the cluster.
        assert_eq!(expanded_set(&ranks, 3, 2, 2), vec![0, 1, 2]);
    }

    #[test]
    fn hand_worked_distances_on_a_line() {
        let (q_g, q_q, g_g) = line();
        let kr = KReciprocal {
            k1: 2,
            k2: 1,
            lambda: 0.3,
        };
        let got = kr.distances_from_matrices(&q_g, &q_q, &g_g, 1, 5).unwrap();
        // o(i, j) = d² / max_a d(a, i)²; for node 0 the farthest is node 5 (12.5² = 156.25),
        // for node 1 node 5 (11.5² = 132.25), for node 2 node 5 (10² = 100).
        let o = |d2: f64, m: f64| d2 / m;
        let v = |ws: [f64; 3]| {
            let e: Vec<f64> = ws.iter().map(|w| (-w).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        // V rows over the columns {0, 1, 2}.
        let v0 = v([0.0, o(1.0, 156.25), o(6.25, 156.25)]);
        let v1 = v([o(1.0, 132.25), 0.0, o(2.25, 132.25)]);
        let v2 = v([o(6.25, 100.0), o(2.25, 100.0), 0.0]);
        let overlap =
            |a: &[f64], b: &[f64]| -> f64 { a.iter().zip(b).map(|(x, y)| x.min(*y)).sum() };
        let jac = |m: f64| 1.0 - m / (2.0 - m);
        let want = [
            0.7 * jac(overlap(&v0, &v1)) + 0.3 * o(1.0, 156.25),
            0.7 * jac(overlap(&v0, &v2)) + 0.3 * o(6.25, 156.25),
            // The other cluster shares no column: d_J = 1.
            0.7 + 0.3 * o(100.0, 156.25),
            0.7 + 0.3 * o(121.0, 156.25),
            0.7 + 0.3 * o(156.25, 156.25),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn features_path_equals_dense_path() {
        // 3 queries and 9 references in 4-D: the sparse feature path against the dense
        // transcription fed the Euclidean distances of the normalised features.
        let raw: Vec<f32> = (0..48)
            .map(|k| ((k * 37 % 23) as f32 - 11.0) / 7.0 + if k % 5 == 0 { 1.5 } else { 0.0 })
            .collect();
        let x = Tensor::from_vec(raw, (12, 4), &Device::Cpu).unwrap();
        let q = x.narrow(0, 0, 3).unwrap();
        let r = x.narrow(0, 3, 9).unwrap();
        let kr = KReciprocal {
            k1: 4,
            k2: 3,
            lambda: 0.3,
        };
        let fitted = kr.fit(&q, Some(&r)).unwrap();
        let sparse = fitted.distances(0, 3).unwrap();
        let norm = |t: &Tensor| -> Vec<Vec<f64>> {
            t.to_vec2::<f32>()
                .unwrap()
                .into_iter()
                .map(|row| {
                    let n = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
                    row.into_iter().map(|v| v as f64 / n).collect()
                })
                .collect()
        };
        let (qn, rn) = (norm(&q), norm(&r));
        let dist = |a: &[Vec<f64>], b: &[Vec<f64>]| -> Vec<f64> {
            a.iter()
                .flat_map(|u| {
                    b.iter().map(move |v| {
                        u.iter()
                            .zip(v)
                            .map(|(x, y)| (x - y).powi(2))
                            .sum::<f64>()
                            .sqrt()
                    })
                })
                .collect()
        };
        let dense = kr
            .distances_from_matrices(&dist(&qn, &rn), &dist(&qn, &qn), &dist(&rn, &rn), 3, 9)
            .unwrap();
        for (a, b) in sparse.iter().zip(&dense) {
            assert!((a - b).abs() < 1e-5, "{sparse:?} vs {dense:?}");
        }
        // Self mode: nodes are the references only.
        let own = kr.fit(&r, None).unwrap();
        assert_eq!((own.num_queries(), own.num_references()), (9, 9));
        assert!(own.queries_are_references());
    }

    #[test]
    fn jaccard_of_one_node_set_matches_the_query_gallery_path() {
        // Node 0 as the query and nodes 1..n as the gallery form the same node set, so the
        // reference path with λ = 0 gives row 0 of the one-set Jaccard matrix.
        let (n, d) = (9, 3);
        let pts: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                let a = i as f64 * 0.7;
                let v = [a.cos(), a.sin(), 0.3 * ((i * i) % 5) as f64];
                let nv = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                v.iter().map(|x| x / nv).collect()
            })
            .collect();
        let cos: Vec<f64> = (0..n * n)
            .map(|p| (0..d).map(|c| pts[p / n][c] * pts[p % n][c]).sum())
            .collect();
        let euclid = |i: usize, j: usize| (2.0 - 2.0 * cos[i * n + j]).max(0.0).sqrt();
        let params = KReciprocal {
            k1: 3,
            k2: 2,
            lambda: 0.0,
        };
        let j = params.jaccard_from_similarities(&cos, n).unwrap();
        let q_g: Vec<f64> = (1..n).map(|g| euclid(0, g)).collect();
        let g_g: Vec<f64> = (1..n)
            .flat_map(|a| (1..n).map(move |b| (a, b)))
            .map(|(a, b)| euclid(a, b))
            .collect();
        let reference = params
            .distances_from_matrices(&q_g, &[0.0], &g_g, 1, n - 1)
            .unwrap();
        for g in 1..n {
            assert!((j[g] - reference[g - 1]).abs() < 1e-12, "{g}");
        }
        // A distance: 0 on the diagonal, symmetric, in [0, 1], and not constant.
        for a in 0..n {
            assert!(j[a * n + a].abs() < 1e-12);
            for b in 0..n {
                assert!((j[a * n + b] - j[b * n + a]).abs() < 1e-12);
                assert!((0.0..=1.0).contains(&j[a * n + b]));
            }
        }
        assert!(j.iter().any(|&x| x > 0.0 && x < 1.0));
        assert!(params.jaccard_from_similarities(&cos[1..], n).is_err());
        let e = KReciprocal { k1: 9, ..params }
            .jaccard_from_similarities(&cos, n)
            .unwrap_err()
            .to_string();
        assert!(e.contains("k1"), "{e}");
    }

    #[test]
    fn bad_input_is_an_error() {
        let (q_g, q_q, g_g) = line();
        let too_big = KReciprocal {
            k1: 6,
            k2: 1,
            lambda: 0.3,
        };
        let e = too_big
            .distances_from_matrices(&q_g, &q_q, &g_g, 1, 5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("k1"), "{e}");
        let k2 = KReciprocal {
            k1: 2,
            k2: 7,
            lambda: 0.3,
        };
        assert!(k2.validate(6).unwrap_err().to_string().contains("k2"));
        let lambda = KReciprocal {
            lambda: 1.5,
            ..KReciprocal::default()
        };
        assert!(lambda
            .validate(30)
            .unwrap_err()
            .to_string()
            .contains("lambda"));
        let ok = KReciprocal {
            k1: 2,
            k2: 1,
            lambda: 0.3,
        };
        assert!(ok
            .distances_from_matrices(&q_g[..4], &q_q, &g_g, 1, 5)
            .is_err());
        let mut nan = q_g.clone();
        nan[0] = f64::NAN;
        assert!(ok.distances_from_matrices(&nan, &q_q, &g_g, 1, 5).is_err());
        let x = Tensor::new(&[[1.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]], &Device::Cpu).unwrap();
        assert!(KReciprocal::default().fit(&x, None).is_err());
        let y = Tensor::new(&[[1.0f32, 0.0, 0.0]], &Device::Cpu).unwrap();
        assert!(ok.fit(&x, Some(&y)).is_err());
    }
}

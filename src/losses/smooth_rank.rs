//! The smooth-rank kernel shared by Smooth-AP, SupAP (ROADMAP) and HAPPIER's H-AP loss.
//!
//! For one query with retrieval list `Ω` (scores `s_j`, levels of match `l_j`, relevances
//! `rel(j)` from the level), every positive `k` (level ≥ 1) gets
//!
//! ```text
//! rank(k)   = 1      + Σ_{j ≠ k}           R_c(s_j − s_k)
//! H-rank(k) = rel(k) + Σ_{j ≠ k, l_j ≥ 1}  min(rel(k), rel(j)) · N_c(s_j − s_k)
//! AP        = Σ_k H-rank(k) / rank(k)  /  Σ_k rel(k)
//! ```
//!
//! where the category `c` of the pair says whether `j` is of lower, equal or higher level than
//! `k`, and `R_c`, `N_c` are step surrogates ([`PairSurrogates`]). This is HAPPIER Eq. (3) with
//! the decomposition of Eq. (5)/Table 7; with binary levels and `rel = 1` it is the AP of
//! Smooth-AP Eq. (5)–(7) (`H-rank` = `rank⁺`). It is the "ranker + score" decomposition of the
//! authors' SupRank code.
//!
//! Two engines compute it, with identical values and gradients (tested):
//! * [`Engine::Streaming`] (default): per query, the items are grouped by level and sorted;
//!   pieces of a surrogate that are constant (the exact step, the sigmoid past its clamp) are
//!   summed by binary search and counting, the others item by item, in `f64`. The backward pass
//!   is written out analytically, in the same sweep as the values. The sigmoid's `exp(−t/τ)`
//!   is factorised per block of scores (see `ExpTable`), so a pair costs a multiplication and
//!   a division, no `exp`. Working memory is `O(N)` per query in flight, plus the `Q × N` score
//!   and gradient matrices; no `N × N` or `N³` tensor is ever built. Time is
//!   `O(N log N + P · W)` per query, `P` the positives and `W` the items of a positive's
//!   sigmoid window (`|s_j − s_k| ≤ 50τ`) or of a smooth surrogate's non-constant pieces.
//! * [`Engine::Autograd`]: the formula as plain candle tensor expressions on the scores' device
//!   (the authors' `quick_forward`), `chunk × N × N` per chunk of queries, differentiated by
//!   candle. Each chunk is differentiated in its own graph, so the peak memory is that of one
//!   chunk.
//!
//! On a CUDA device, [`Engine::Streaming`] hands the queries to the kernels of [`device`]
//! (the same quantities, a GPU thread per (query, positive) and per (query, item), no host pass)
//! while their work `Σ_q P_q · N` is at most [`crate::kernels::max_work`].
//!
//! Both engines return the per-query values together with the exact Jacobian of each query's
//! AP with respect to its own row of scores (a query's AP depends on no other row); the
//! Jacobian is computed in the forward call, and only when the scores are part of a graph. The
//! result is
//! attached to the caller's graph by one op (`crate::attach`) whose value is exactly `ap` and
//! whose backward pass is exactly `∂S_qj = J_qj ∂ap_q`, so the caller differentiates through the
//! similarity matrix (normalisation, matmul, the network) with ordinary candle autograd.

use crate::error::{Error, Result};
use crate::hierarchy::{Labels, Relevance};
use crate::losses::surrogate::{Piece, PieceFn, StepSurrogate, Surrogate, Upper};
use candle_core::{DType, Device, Tensor, Var};
use rayon::prelude::*;

pub mod device;

/// Level marking an item that is not in the query's retrieval set (the query itself, in the
/// papers' protocol).
pub const EXCLUDED: u8 = u8::MAX;

/// Which engine computes the smooth ranks (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// Sorted, per-query CPU kernel with an analytic backward pass; `O(N)` memory per query.
    #[default]
    Streaming,
    /// Candle tensor expressions differentiated by autograd; `O(chunk × N²)` memory.
    Autograd,
}

/// Level of `j` compared with the level of `k`: which surrogate a pair uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// `l_j < l_k` (includes the negatives): HAPPIER's `rank^<`.
    Lower = 0,
    /// `l_j = l_k`.
    Equal = 1,
    /// `l_j > l_k`: HAPPIER's `H-rank^>`.
    Higher = 2,
}

impl Category {
    fn of(level_j: u8, level_k: u8) -> Category {
        match level_j.cmp(&level_k) {
            std::cmp::Ordering::Less => Category::Lower,
            std::cmp::Ordering::Equal => Category::Equal,
            std::cmp::Ordering::Greater => Category::Higher,
        }
    }
}

/// The surrogate of each pair category, for the rank (denominator) and the H-rank (numerator),
/// indexed by [`Category`] as `usize`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairSurrogates {
    /// `R_c` in `rank(k)`.
    pub rank: [Surrogate; 3],
    /// `N_c` in `H-rank(k)` (Smooth-AP's `rank⁺` when the levels are binary).
    pub hrank: [Surrogate; 3],
}

impl PairSurrogates {
    /// The same surrogate for every pair, in both ranks (Smooth-AP; HAPPIER's "sigmoid
    /// baseline" of Table 5 with a sigmoid).
    pub fn uniform(s: Surrogate) -> Self {
        PairSurrogates {
            rank: [s; 3],
            hrank: [s; 3],
        }
    }

    /// Errors if any surrogate has invalid parameters.
    pub fn validate(&self) -> Result<()> {
        self.rank
            .iter()
            .chain(&self.hrank)
            .try_for_each(|s| s.validate())
    }
}

/// A batch of queries to rank: for each query `q` and item `j`, the level of match `l_qj`
/// (0 = negative, [`EXCLUDED`] = not in the retrieval set) and, per query, the relevance of each
/// level `0..=L`.
#[derive(Debug, Clone, PartialEq)]
pub struct RankProblem {
    queries: usize,
    items: usize,
    num_levels: usize,
    /// Row-major `Q × N`.
    levels: Vec<u8>,
    /// Row-major `Q × (L + 1)`.
    relevance: Vec<f64>,
    /// The (query, item) pairs at a level ≥ 1 (`Σ_q P_q`): the work of the device kernels is
    /// this times `N`, known before they list the pairs.
    positive_pairs: usize,
}

impl RankProblem {
    /// Builds a problem from raw levels (`Q × N`, row-major, values in `0..=L` or
    /// [`EXCLUDED`]) and per-query level relevances (`Q × (L + 1)`, `rel[0]` must be 0, the
    /// others finite and ≥ 0).
    pub fn new(
        queries: usize,
        items: usize,
        num_levels: usize,
        levels: Vec<u8>,
        relevance: Vec<f64>,
    ) -> Result<Self> {
        if num_levels == 0 || num_levels >= EXCLUDED as usize {
            return Err(Error::invalid(
                "num_levels",
                format!("must be in 1..{EXCLUDED}, got {num_levels}"),
            ));
        }
        if levels.len() != queries * items {
            return Err(Error::Shape(format!(
                "{} levels for {queries} queries × {items} items",
                levels.len()
            )));
        }
        if relevance.len() != queries * (num_levels + 1) {
            return Err(Error::Shape(format!(
                "{} relevances for {queries} queries × {} levels",
                relevance.len(),
                num_levels + 1
            )));
        }
        // Passes without an early exit (they vectorise: every training step builds a problem)
        // find whether any level is out of range, the search for which one only then, and count
        // the positive pairs.
        let out_of_range = |l: u8| l != EXCLUDED && usize::from(l) > num_levels;
        let bad = levels.iter().fold(false, |bad, &l| bad | out_of_range(l));
        // `1 ≤ l < EXCLUDED` as one unsigned comparison, summed in `u32` lanes per block.
        let positive_pairs = levels
            .chunks(1 << 24)
            .map(|c| {
                c.iter()
                    .map(|&l| u32::from(l.wrapping_sub(1) < EXCLUDED - 1))
                    .sum::<u32>() as usize
            })
            .sum();
        if bad {
            let i = levels.iter().position(|&l| out_of_range(l)).unwrap_or(0);
            return Err(Error::invalid(
                "levels",
                format!(
                    "query {} item {} has level {} > L = {num_levels}",
                    i / items.max(1),
                    i % items.max(1),
                    levels[i]
                ),
            ));
        }
        for (q, row) in relevance.chunks(num_levels + 1).enumerate() {
            if row[0] != 0.0 {
                return Err(Error::invalid(
                    "relevance",
                    format!("query {q}: negatives (level 0) must have relevance 0"),
                ));
            }
            if let Some(v) = row.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return Err(Error::invalid(
                    "relevance",
                    format!("query {q}: relevances must be finite and ≥ 0, got {v}"),
                ));
            }
        }
        Ok(RankProblem {
            queries,
            items,
            num_levels,
            levels,
            relevance,
            positive_pairs,
        })
    }

    /// The batch as its own retrieval set with binary relevance: positives share the query's
    /// fine class (column 0). Smooth-AP, SupAP.
    ///
    /// `include_self = false` is the papers' protocol (the query is not in its own retrieval
    /// set); `true` is the authors' code, where the query is an item of its own retrieval and
    /// positive sets (similarity `s_qq`, a positive at rank ≈ 1).
    pub fn binary(labels: &Labels, include_self: bool) -> Result<Self> {
        let b = labels.len();
        let fine = super::dense_fine_ids(labels);
        let mut levels = Vec::with_capacity(b * b);
        // Row by row as one comparison of the class column (which vectorises): this runs on
        // every training step, before any kernel of the loss can start.
        for &fq in &fine {
            levels.extend(fine.iter().map(|&f| u8::from(f == fq)));
        }
        if !include_self {
            exclude_diagonal(&mut levels, b);
        }
        let relevance = [0.0, 1.0].repeat(b);
        Self::new(b, b, 1, levels, relevance)
    }

    /// The batch as its own retrieval set with hierarchical levels (`labels.level(q, j)`) and
    /// the relevance `relevance` computed for each query from the populations of the levels
    /// *inside the batch* (the query itself not counted, unless the relevance asks for it with
    /// `count_query`, as the authors' code does). HAPPIER.
    pub fn hierarchical(
        labels: &Labels,
        include_self: bool,
        relevance: &Relevance,
    ) -> Result<Self> {
        let b = labels.len();
        let num_levels = labels.num_levels();
        relevance.validate(num_levels)?;
        let mut levels = vec![0u8; b * b];
        let mut rel = Vec::with_capacity(b * (num_levels + 1));
        let mut rows = super::BatchLevels::new(labels);
        let mut counts = vec![0usize; num_levels + 1];
        for (q, row) in levels.chunks_exact_mut(b.max(1)).enumerate().take(b) {
            let at_least = rows.row(q, row);
            // The populations of the levels among the others (the query is at level L).
            for l in 0..=num_levels {
                counts[l] = at_least[l] - at_least.get(l + 1).copied().unwrap_or(0);
            }
            counts[num_levels] -= 1;
            rel.extend(relevance.level_values(&counts));
        }
        if !include_self {
            exclude_diagonal(&mut levels, b);
        }
        Self::new(b, b, num_levels, levels, rel)
    }

    /// Number of queries `Q`.
    pub fn queries(&self) -> usize {
        self.queries
    }

    /// Number of items `N` in each retrieval list.
    pub fn items(&self) -> usize {
        self.items
    }

    /// Number of levels `L`.
    pub fn num_levels(&self) -> usize {
        self.num_levels
    }

    /// Levels of query `q`'s items.
    pub fn levels_row(&self, q: usize) -> &[u8] {
        &self.levels[q * self.items..(q + 1) * self.items]
    }

    /// Relevance of each level `0..=L` for query `q`.
    pub fn relevance_row(&self, q: usize) -> &[f64] {
        let w = self.num_levels + 1;
        &self.relevance[q * w..(q + 1) * w]
    }

    /// Whether query `q` has at least one positive with non-zero relevance in its list (its AP
    /// is defined).
    pub fn has_positive(&self, q: usize) -> bool {
        let rel = self.relevance_row(q);
        self.levels_row(q)
            .iter()
            .any(|&l| l != EXCLUDED && l > 0 && rel[l as usize] > 0.0)
    }
}

/// Marks each item of a `B × B` batch problem as outside its own query's retrieval set (the
/// papers' protocol).
fn exclude_diagonal(levels: &mut [u8], b: usize) {
    for q in 0..b {
        levels[q * b + q] = EXCLUDED;
    }
}

/// Per-query smooth AP values, differentiable with respect to the scores.
#[derive(Debug, Clone)]
pub struct QueryAp {
    /// `Q` values (0 for the queries without positives).
    pub ap: Tensor,
    /// Whether each query has a positive; queries without one are left out of the mean.
    pub valid: Vec<bool>,
}

impl QueryAp {
    /// `1 − mean AP` over the queries that have a positive (Smooth-AP Eq. 7; HAPPIER's
    /// `1 − mH-AP`). A query without any positive in the batch (a singleton class in the papers'
    /// protocol) contributes nothing; a batch where no query has a positive is an error, since
    /// the loss would be undefined (0/0), not zero.
    pub fn mean_loss(&self) -> Result<Tensor> {
        let n_valid = self.valid.iter().filter(|v| **v).count();
        if n_valid == 0 {
            return Err(Error::Labels(
                "no query of the batch has a positive (every class has a single sample); \
                 AP is undefined — sample at least two items per class"
                    .into(),
            ));
        }
        // On CUDA one op of two kernels (`device::mean_loss`); the CPU's formulation below is
        // its reference.
        if device::mean_applies(&self.ap) {
            return device::mean_loss(&self.ap, &self.valid, n_valid);
        }
        let mask: Vec<f64> = self.valid.iter().map(|&v| f64::from(u8::from(v))).collect();
        let mask = Tensor::from_vec(mask, self.valid.len(), self.ap.device())?
            .to_dtype(self.ap.dtype())?;
        let mean = ((&self.ap * mask)?.sum_all()? / n_valid as f64)?;
        Ok(mean.affine(-1.0, 1.0)?)
    }
}

/// The `B × B` matrix of scores `s_qj = ⟨v_q, v_j⟩`, cosine similarities when `normalize`
/// (Smooth-AP Eq. 1; HAPPIER §3.1).
pub fn similarity_matrix(embeddings: &Tensor, normalize: bool) -> Result<Tensor> {
    let v = if normalize {
        crate::losses::l2_normalize(embeddings, "embeddings")?
    } else {
        embeddings.clone()
    };
    Ok(v.matmul(&v.t()?)?)
}

/// The smooth AP of every query of `problem`, from `scores` (`Q × N`, any float dtype and
/// device), with the chosen engine. `query_chunk` bounds how many queries are processed at once
/// (default: all); it changes memory, never the values or the gradients.
pub fn smooth_average_precision(
    scores: &Tensor,
    problem: &RankProblem,
    surrogates: &PairSurrogates,
    engine: Engine,
    query_chunk: Option<usize>,
) -> Result<QueryAp> {
    surrogates.validate()?;
    let (q, n) = scores.dims2()?;
    if q != problem.queries || n != problem.items {
        return Err(Error::Shape(format!(
            "scores are {q} × {n} but the problem has {} queries × {} items",
            problem.queries, problem.items
        )));
    }
    let chunk = match query_chunk {
        Some(0) => {
            return Err(Error::invalid("query_chunk", "must be at least 1"));
        }
        Some(c) => c.min(q.max(1)),
        None => q.max(1),
    };
    let need_grad = scores.track_op();
    let (values, jacobian) = match engine {
        // On a GPU the streaming engine's host pass is replaced by the device kernels, which
        // compute the same values and Jacobian (see `device`); the chunk bounds only the
        // memory of the other engines.
        Engine::Streaming => match device::plan(scores, problem) {
            Some(positives) => device::run(scores, problem, positives, surrogates, need_grad)?,
            None => streaming(scores, problem, surrogates, chunk, need_grad)?,
        },
        Engine::Autograd => autograd(scores, problem, surrogates, chunk, need_grad)?,
    };
    let ap = attach(values, jacobian, scores)?;
    let valid = (0..q).map(|i| problem.has_positive(i)).collect();
    Ok(QueryAp { ap, valid })
}

/// `values` as a function of `S` whose gradient is `J`: `∂S = J ⊙ ∂values` (row by row).
/// One op (`crate::attach`), whose forward pass copies the values and whose backward pass is
/// that one product — where `values + rowsum(S ⊙ J) − detach(…)` took four operations forward
/// and as many backward, each a launch on a device (a loss step at B = 256 is launch-bound).
fn attach(values: Tensor, jacobian: Option<Tensor>, scores: &Tensor) -> Result<Tensor> {
    match jacobian {
        None => Ok(values),
        Some(j) => crate::attach::attach(scores, &values.detach(), move |_, _, grad| {
            Ok(Some(j.broadcast_mul(&grad.unsqueeze(1)?)?))
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Autograd engine.

/// The smooth AP of every query as one plain candle expression (`Q × N × N` pairs): the
/// authors' `quick_forward`, and the reference the other paths are tested against. Queries
/// without positives get 0.
pub fn ap_tensor(
    scores: &Tensor,
    problem: &RankProblem,
    surrogates: &PairSurrogates,
) -> Result<Tensor> {
    ap_tensor_rows(scores, problem, 0, surrogates)
}

/// [`ap_tensor`] for the rows `first..first + scores.rows` of `problem`.
fn ap_tensor_rows(
    scores: &Tensor,
    problem: &RankProblem,
    first: usize,
    sur: &PairSurrogates,
) -> Result<Tensor> {
    let (c, n) = scores.dims2()?;
    let dev = scores.device();
    let dt = scores.dtype();
    let levels = problem.levels[first * n..(first + c) * n].to_vec();
    let mut item_rel = Vec::with_capacity(c * n);
    let mut norm = Vec::with_capacity(c);
    for q in first..first + c {
        let rel = problem.relevance_row(q);
        let mut z = 0.0;
        for &l in problem.levels_row(q) {
            let r = if l == EXCLUDED { 0.0 } else { rel[l as usize] };
            z += r;
            item_rel.push(r);
        }
        norm.push(if z > 0.0 { z } else { 1.0 });
    }
    let lv = Tensor::from_vec(levels, (c, n), dev)?;
    let included = lv.ne(EXCLUDED)?;
    let positive = (lv.ge(1u8)? * &included)?;
    let lvj = lv.unsqueeze(1)?;
    let lvk = lv.unsqueeze(2)?;
    let not_self = Tensor::eye(n, DType::U8, dev)?.eq(0u8)?.unsqueeze(0)?;
    let pair = included
        .unsqueeze(1)?
        .broadcast_mul(&included.unsqueeze(2)?)?
        .broadcast_mul(&not_self)?;
    let masks = [
        lvj.broadcast_lt(&lvk)?.mul(&pair)?,
        lvj.broadcast_eq(&lvk)?.mul(&pair)?,
        lvj.broadcast_gt(&lvk)?.mul(&pair)?,
    ];
    // t[q, k, j] = s_qj − s_qk.
    let t = scores.unsqueeze(1)?.broadcast_sub(&scores.unsqueeze(2)?)?;
    let zeros = t.zeros_like()?;
    let mut rank_terms = zeros.clone();
    let mut hrank_terms = zeros.clone();
    for (cat, mask) in masks.iter().enumerate() {
        rank_terms = (rank_terms + mask.where_cond(&sur.rank[cat].apply(&t)?, &zeros)?)?;
        hrank_terms = (hrank_terms + mask.where_cond(&sur.hrank[cat].apply(&t)?, &zeros)?)?;
    }
    let r = Tensor::from_vec(item_rel, (c, n), dev)?.to_dtype(dt)?;
    let min_rel = r.unsqueeze(1)?.broadcast_minimum(&r.unsqueeze(2)?)?;
    let rank = (rank_terms.sum(2)? + 1.0)?;
    let hrank = ((hrank_terms * min_rel)?.sum(2)? + &r)?;
    let ratio = (hrank / rank)?.mul(&positive.to_dtype(dt)?)?;
    let norm = Tensor::from_vec(norm, c, dev)?.to_dtype(dt)?;
    Ok(ratio.sum(1)?.div(&norm)?)
}

type Outputs = (Tensor, Option<Tensor>);

fn autograd(
    scores: &Tensor,
    problem: &RankProblem,
    sur: &PairSurrogates,
    chunk: usize,
    need_grad: bool,
) -> Result<Outputs> {
    let (q, _) = scores.dims2()?;
    let mut values = Vec::new();
    let mut jac = Vec::new();
    let mut first = 0;
    while first < q {
        let c = chunk.min(q - first);
        let rows = scores.narrow(0, first, c)?.detach();
        if need_grad {
            let var = Var::from_tensor(&rows)?;
            let ap = ap_tensor_rows(var.as_tensor(), problem, first, sur)?;
            let grads = ap.sum_all()?.backward()?;
            jac.push(match grads.get(var.as_tensor()) {
                Some(g) => g.clone(),
                None => rows.zeros_like()?,
            });
            values.push(ap.detach());
        } else {
            values.push(ap_tensor_rows(&rows, problem, first, sur)?);
        }
        first += c;
    }
    let values = Tensor::cat(&values, 0)?;
    let jac = if need_grad {
        Some(Tensor::cat(&jac, 0)?)
    } else {
        None
    };
    Ok((values, jac))
}

// ---------------------------------------------------------------------------------------------
// Streaming engine.

/// Pieces of the six surrogates, computed once per call.
struct Compiled {
    rank: [Vec<Piece>; 3],
    hrank: [Vec<Piece>; 3],
    /// Distinct sigmoid temperatures among the pieces, for the exponential tables.
    taus: Vec<f64>,
}

impl Compiled {
    fn new(s: &PairSurrogates) -> Self {
        let rank = s.rank.map(|x| x.pieces());
        let hrank = s.hrank.map(|x| x.pieces());
        let mut taus: Vec<f64> = Vec::new();
        for p in rank.iter().chain(&hrank).flatten() {
            if let PieceFn::Sigmoid { tau, .. } = p.f {
                if !taus.contains(&tau) {
                    taus.push(tau);
                }
            }
        }
        Compiled { rank, hrank, taus }
    }
}

fn streaming(
    scores: &Tensor,
    problem: &RankProblem,
    sur: &PairSurrogates,
    chunk: usize,
    need_grad: bool,
) -> Result<Outputs> {
    let (q, n) = scores.dims2()?;
    let host = scores
        .detach()
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let compiled = Compiled::new(sur);
    let mut values = vec![0.0; q];
    let mut jac = if need_grad {
        vec![0.0; q * n]
    } else {
        Vec::new()
    };
    let mut first = 0;
    while first < q {
        let c = chunk.min(q - first);
        let vals = &mut values[first..first + c];
        let run = |i: usize, v: &mut f64, jrow: Option<&mut [f64]>| {
            let qi = first + i;
            *v = query_ap(
                &host[qi * n..(qi + 1) * n],
                problem.levels_row(qi),
                problem.relevance_row(qi),
                &compiled,
                jrow,
            );
        };
        if need_grad {
            let rows = &mut jac[first * n..(first + c) * n];
            vals.par_iter_mut()
                .zip(rows.par_chunks_mut(n.max(1)))
                .enumerate()
                .for_each(|(i, (v, jrow))| run(i, v, Some(jrow)));
        } else {
            vals.par_iter_mut()
                .enumerate()
                .for_each(|(i, v)| run(i, v, None));
        }
        first += c;
    }
    let dev = scores.device();
    let dt = scores.dtype();
    let values = Tensor::from_vec(values, q, dev)?.to_dtype(dt)?;
    let jac = if need_grad {
        Some(Tensor::from_vec(jac, (q, n), dev)?.to_dtype(dt)?)
    } else {
        None
    };
    Ok((values, jac))
}

/// Half-width, in units of τ, of the score blocks of an [`ExpTable`].
const BLOCK_HALF_WIDTH: f64 = 8.0;

/// `exp((c_b − x_i)/τ)` for the items of a sorted group cut into blocks of scores within
/// `±8τ` of a centre `c_b`, so that every sigmoid needs no `exp` of its own:
/// `exp(−(x_i − s_k)/τ) = exp((s_k − c_b)/τ) · exp((c_b − x_i)/τ)`, the first factor being
/// shared by the block. For the items inside the sigmoid's clamp (`|x_i − s_k| ≤ 50τ`) the
/// exponents are at most 8 and 58 in magnitude, so nothing overflows whatever τ, and the
/// relative error of the product stays within a small multiple of the direct `exp(−t/τ)`'s
/// (measured: values and gradients within 2·10⁻¹⁵ of the autograd engine in f64).
struct ExpTable {
    /// Start index of each block, then the group size.
    starts: Vec<usize>,
    centers: Vec<f64>,
    factor: Vec<f64>,
}

impl ExpTable {
    fn new(x: &[f64], tau: f64) -> Self {
        let width = BLOCK_HALF_WIDTH * tau;
        let mut starts = Vec::new();
        let mut centers = Vec::new();
        let mut factor = vec![0.0; x.len()];
        let mut i = 0;
        while i < x.len() {
            let c = x[i] + width;
            let end = i + x[i..].partition_point(|&v| v <= c + width).max(1);
            for j in i..end {
                factor[j] = ((c - x[j]) / tau).exp();
            }
            starts.push(i);
            centers.push(c);
            i = end;
        }
        starts.push(x.len());
        ExpTable {
            starts,
            centers,
            factor,
        }
    }
}

/// The items of one level, sorted by increasing score, with their exponential tables (one per
/// sigmoid temperature of the surrogates).
struct Group {
    x: Vec<f64>,
    col: Vec<usize>,
    tables: Vec<ExpTable>,
}

/// A run of items whose surrogate derivatives are stored in the scratch buffer: group `g`,
/// sorted indices `lo..hi` minus `skip`, derivatives from `offset`, and whether they belong to
/// the rank (`false`) or the H-rank (`true`).
struct Segment {
    g: usize,
    lo: usize,
    hi: usize,
    skip: Option<usize>,
    offset: usize,
    hrank: bool,
}

/// Smooth AP of one query and, when `jac` is given, its gradient with respect to the query's
/// scores, written into `jac` (zero-initialised, `N` entries).
///
/// Each positive `k` is handled in one sweep: the surrogate values give `rank(k)` and
/// `H-rank(k)`, and the surrogate derivatives are kept in a scratch buffer until
/// `∂AP/∂rank(k) = −H-rank(k)/(rank(k)² Z)` and `∂AP/∂H-rank(k) = 1/(rank(k) Z)` are known,
/// then scattered: `t = s_j − s_k`, so what `s_j` gains `s_k` loses.
fn query_ap(
    scores: &[f64],
    levels: &[u8],
    rel: &[f64],
    sur: &Compiled,
    jac: Option<&mut [f64]>,
) -> f64 {
    let num_levels = rel.len() - 1;
    let groups = sorted_groups(scores, levels, num_levels, &sur.taus);
    let norm: f64 = (1..=num_levels)
        .map(|l| groups[l].x.len() as f64 * rel[l])
        .sum();
    if norm.is_nan() || norm <= 0.0 {
        return 0.0;
    }
    let need_grad = jac.is_some();
    let mut grad: Vec<Vec<f64>> = if need_grad {
        groups.iter().map(|g| vec![0.0; g.x.len()]).collect()
    } else {
        Vec::new()
    };
    let mut deriv = Vec::new();
    let mut segments = Vec::new();
    let mut total = 0.0;
    for lk in 1..=num_levels {
        let rk = rel[lk];
        // Piece boundaries in every group, per surrogate slot (rank, H-rank). The positives of
        // level `lk` come in increasing score, so the boundaries only move forward.
        let mut bounds: Vec<[Vec<usize>; 2]> = (0..groups.len())
            .map(|lg| {
                let cat = Category::of(lg as u8, lk as u8) as usize;
                [vec![0; sur.rank[cat].len()], vec![0; sur.hrank[cat].len()]]
            })
            .collect();
        for ik in 0..groups[lk].x.len() {
            let sk = groups[lk].x[ik];
            deriv.clear();
            segments.clear();
            let mut rank = 1.0;
            let mut hrank = rk;
            for (lg, g) in groups.iter().enumerate() {
                if g.x.is_empty() {
                    continue;
                }
                let cat = Category::of(lg as u8, lk as u8) as usize;
                let skip = (lg == lk).then_some(ik);
                let mut sweep = Sweep {
                    group: g,
                    g: lg,
                    sk,
                    skip,
                    taus: &sur.taus,
                    deriv: need_grad.then_some(&mut deriv),
                    segments: &mut segments,
                };
                let [rank_bounds, hrank_bounds] = &mut bounds[lg];
                rank += sweep.sum(&sur.rank[cat], rank_bounds, false);
                let w = pair_weight(rk, rel, lg);
                if w != 0.0 {
                    hrank += w * sweep.sum(&sur.hrank[cat], hrank_bounds, true);
                }
            }
            total += hrank / rank;
            if need_grad {
                let d_rank = -hrank / (rank * rank * norm);
                let d_hrank = 1.0 / (rank * norm);
                let mut acc = 0.0;
                for s in &segments {
                    let coef = if s.hrank {
                        d_hrank * pair_weight(rk, rel, s.g)
                    } else {
                        d_rank
                    };
                    let dst = &mut grad[s.g];
                    let mut src = s.offset;
                    for range in split_around(s.lo, s.hi, s.skip) {
                        let n = range.len();
                        let d = &deriv[src..src + n];
                        for (out, &dv) in dst[range].iter_mut().zip(d) {
                            *out += coef * dv;
                        }
                        // Summed apart so that the scatter loop carries no dependency.
                        acc += coef * sum4(d);
                        src += n;
                    }
                }
                grad[lk][ik] -= acc;
            }
        }
    }
    if let Some(jac) = jac {
        for (g, dg) in groups.iter().zip(&grad) {
            for (&col, &d) in g.col.iter().zip(dg) {
                jac[col] = d;
            }
        }
    }
    total / norm
}

/// The items of the retrieval list grouped by level, each group sorted by increasing score
/// (ties by column, so the result does not depend on the sort algorithm).
fn sorted_groups(scores: &[f64], levels: &[u8], num_levels: usize, taus: &[f64]) -> Vec<Group> {
    let mut order: Vec<usize> = (0..scores.len())
        .filter(|&j| levels[j] != EXCLUDED)
        .collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    let mut groups: Vec<Group> = (0..=num_levels)
        .map(|_| Group {
            x: Vec::new(),
            col: Vec::new(),
            tables: Vec::new(),
        })
        .collect();
    for j in order {
        let g = &mut groups[levels[j] as usize];
        g.x.push(scores[j]);
        g.col.push(j);
    }
    for g in &mut groups {
        g.tables = taus.iter().map(|&tau| ExpTable::new(&g.x, tau)).collect();
    }
    groups
}

/// First index `≥ from` where `pred` fails, for a predicate that holds on a prefix of `x` and
/// at every index below `from`: exponential then binary search, `O(log distance)`.
fn gallop(x: &[f64], from: usize, pred: impl Fn(f64) -> bool) -> usize {
    if from >= x.len() || !pred(x[from]) {
        return from;
    }
    let mut lo = from;
    let mut step = 1;
    loop {
        let probe = lo + step;
        if probe >= x.len() || !pred(x[probe]) {
            let end = probe.min(x.len());
            return lo + 1 + x[lo + 1..end].partition_point(|&v| pred(v));
        }
        lo = probe;
        step *= 2;
    }
}

/// `Σ x` with four partial sums (vectorisable; fixed order, so deterministic).
fn sum4(x: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut c = x.chunks_exact(4);
    for q in &mut c {
        for l in 0..4 {
            acc[l] += q[l];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + c.remainder().iter().sum::<f64>()
}

/// `lo..hi` without `skip`, as two ranges, so that the inner loops have no branch.
fn split_around(lo: usize, hi: usize, skip: Option<usize>) -> [std::ops::Range<usize>; 2] {
    match skip {
        Some(s) => [lo..s, s + 1..hi],
        None => [lo..hi, hi..hi],
    }
}

/// `min(rel(k), rel(j))` for `j` of level `lg`; 0 for negatives.
#[inline]
fn pair_weight(rk: f64, rel: &[f64], lg: usize) -> f64 {
    if lg == 0 {
        0.0
    } else {
        rk.min(rel[lg])
    }
}

/// One group seen from one positive `k`: sums a surrogate of `t = x − s_k` over the group
/// (minus `k` itself) and, when `deriv` is given, stores the derivatives of the non-constant
/// pieces.
struct Sweep<'a> {
    group: &'a Group,
    g: usize,
    sk: f64,
    skip: Option<usize>,
    taus: &'a [f64],
    deriv: Option<&'a mut Vec<f64>>,
    segments: &'a mut Vec<Segment>,
}

impl Sweep<'_> {
    /// `Σ_{i ≠ skip} f(x_i − s_k)` over the pieces of `f`. `bounds` holds the end of each
    /// piece for the previous, lower `s_k` of the same sweep order (or zeros), and is moved
    /// forward to this `s_k`.
    fn sum(&mut self, pieces: &[Piece], bounds: &mut [usize], hrank: bool) -> f64 {
        let x = &self.group.x;
        let sk = self.sk;
        let mut total = 0.0;
        let mut lo = 0;
        for (p, end) in pieces.iter().zip(bounds.iter_mut()) {
            // `x − sk` is non-decreasing in `x`, so each predicate holds on a prefix of `x`, and
            // that prefix only grows with `sk`.
            let hi = match p.upper {
                Upper::Lt(b) => gallop(x, (*end).max(lo), |v| v - sk < b),
                Upper::Le(b) => gallop(x, (*end).max(lo), |v| v - sk <= b),
                Upper::Inf => x.len(),
            };
            *end = hi;
            if hi > lo {
                total += self.piece(p.f, lo, hi, hrank);
            }
            lo = hi;
        }
        total
    }

    /// Sum of one piece over `lo..hi` minus `skip`.
    fn piece(&mut self, f: PieceFn, lo: usize, hi: usize, hrank: bool) -> f64 {
        let skip = self.skip.filter(|s| (lo..hi).contains(s));
        let count = (hi - lo - usize::from(skip.is_some())) as f64;
        if let PieceFn::Const(c) = f {
            return c * count;
        }
        if let Some(deriv) = self.deriv.as_deref_mut() {
            self.segments.push(Segment {
                g: self.g,
                lo,
                hi,
                skip,
                offset: deriv.len(),
                hrank,
            });
        }
        let mut total = 0.0;
        for range in split_around(lo, hi, skip) {
            if range.is_empty() {
                continue;
            }
            total += match f {
                PieceFn::Sigmoid { tau, add } => {
                    let t = self.taus.iter().position(|&x| x == tau).expect("table");
                    sigmoid_run(
                        &self.group.tables[t],
                        &self.group.x,
                        self.sk,
                        tau,
                        range.clone(),
                        self.deriv.as_deref_mut(),
                    ) + add * range.len() as f64
                }
                PieceFn::Affine { .. } => {
                    let mut s = 0.0;
                    for &v in &self.group.x[range.clone()] {
                        let (val, d) = f.eval(v - self.sk);
                        s += val;
                        if let Some(deriv) = self.deriv.as_deref_mut() {
                            deriv.push(d);
                        }
                    }
                    s
                }
                PieceFn::Const(_) => unreachable!("handled above"),
            };
        }
        total
    }
}

/// `Σ_i σ_i` and `out_i = σ_i² e_i / τ` for `e_i = shared · factor_i = exp(−t_i/τ)`,
/// `σ_i = 1/(1 + e_i)`: the innermost loop of the engine. Four independent partial sums let
/// the compiler vectorise it (the division dominates); the summation order is fixed, so
/// results are deterministic.
#[inline]
fn sigmoid_block(shared: f64, inv_tau: f64, factors: &[f64], out: &mut [f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut f4 = factors.chunks_exact(4);
    let mut o4 = out.chunks_exact_mut(4);
    for (f, o) in (&mut f4).zip(&mut o4) {
        for l in 0..4 {
            let e = shared * f[l];
            let s = 1.0 / (e + 1.0);
            acc[l] += s;
            o[l] = s * s * e * inv_tau;
        }
    }
    let mut rest = 0.0;
    for (&f, o) in f4.remainder().iter().zip(o4.into_remainder()) {
        let e = shared * f;
        let s = 1.0 / (e + 1.0);
        rest += s;
        *o = s * s * e * inv_tau;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + rest
}

/// `Σ σ((x_i − s_k)/τ)` over `range` (inside the clamp), pushing `σ'(·)/τ` to `deriv`.
fn sigmoid_run(
    table: &ExpTable,
    x: &[f64],
    sk: f64,
    tau: f64,
    range: std::ops::Range<usize>,
    mut deriv: Option<&mut Vec<f64>>,
) -> f64 {
    debug_assert!(range.end <= x.len());
    let inv_tau = 1.0 / tau;
    let mut total = 0.0;
    let mut b = table.starts.partition_point(|&s| s <= range.start) - 1;
    let mut i = range.start;
    while i < range.end {
        let end = table.starts[b + 1].min(range.end);
        let shared = ((sk - table.centers[b]) / tau).exp();
        let factors = &table.factor[i..end];
        total += match deriv.as_deref_mut() {
            Some(d) => {
                let base = d.len();
                d.resize(base + factors.len(), 0.0);
                sigmoid_block(shared, inv_tau, factors, &mut d[base..])
            }
            None => factors.iter().map(|&f| 1.0 / (shared * f + 1.0)).sum(),
        };
        i = end;
        b += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::surrogate::{Heaviside, Sigmoid, UpperStep};

    fn problem_one_query(levels: Vec<u8>, rel: Vec<f64>) -> RankProblem {
        let n = levels.len();
        let l = rel.len() - 1;
        RankProblem::new(1, n, l, levels, rel).unwrap()
    }

    #[test]
    fn exact_step_gives_exact_ap() {
        // Smooth-AP §B.1.6 ranking: labels 1 0 1 1 0 0 0 1 in decreasing score, AP = 0.729167.
        let levels = vec![1, 0, 1, 1, 0, 0, 0, 1];
        let scores: Vec<f64> = (0..8).map(|i| 1.0 - 0.1 * i as f64).collect();
        let p = problem_one_query(levels, vec![0.0, 1.0]);
        let s = Tensor::from_vec(scores, (1, 8), &Device::Cpu).unwrap();
        let sur = PairSurrogates::uniform(Heaviside::default().into());
        for engine in [Engine::Streaming, Engine::Autograd] {
            let ap = smooth_average_precision(&s, &p, &sur, engine, None).unwrap();
            let v = ap.ap.to_vec1::<f64>().unwrap()[0];
            assert!(
                (v - (1.0 + 2.0 / 3.0 + 0.75 + 0.5) / 4.0).abs() < 1e-15,
                "{v}"
            );
        }
    }

    #[test]
    fn streaming_matches_autograd_on_a_mixed_problem() {
        // Three levels, an excluded item, ties, and every surrogate family.
        let levels = vec![2, 0, 1, EXCLUDED, 2, 1, 0, 2, 1];
        let scores = vec![0.3, 0.31, 0.3, 0.9, -0.2, 0.05, 0.3, 0.6, -0.25];
        let p = problem_one_query(levels, vec![0.0, 0.2, 0.5]);
        let s = Tensor::from_vec(scores, (1, 9), &Device::Cpu).unwrap();
        let sur = PairSurrogates {
            rank: [
                UpperStep::sop_code().into(),
                Heaviside::default().into(),
                Sigmoid { tau: 0.1 }.into(),
            ],
            hrank: [
                Heaviside { zero: 0.5 }.into(),
                Sigmoid { tau: 0.05 }.into(),
                crate::losses::surrogate::LowerStep::default().into(),
            ],
        };
        let var = Var::from_tensor(&s).unwrap();
        let mut got = Vec::new();
        for engine in [Engine::Streaming, Engine::Autograd] {
            let ap = smooth_average_precision(var.as_tensor(), &p, &sur, engine, Some(1)).unwrap();
            let g = ap.ap.sum_all().unwrap().backward().unwrap();
            let g = g.get(var.as_tensor()).unwrap().flatten_all().unwrap();
            got.push((
                ap.ap.to_vec1::<f64>().unwrap()[0],
                g.to_vec1::<f64>().unwrap(),
            ));
        }
        assert!((got[0].0 - got[1].0).abs() < 1e-14, "{got:?}");
        for (a, b) in got[0].1.iter().zip(&got[1].1) {
            assert!((a - b).abs() < 1e-12, "{got:?}");
        }
        assert_eq!(got[0].1[3], 0.0, "excluded item gets no gradient");
    }

    #[test]
    fn exp_tables_match_the_direct_sigmoid() {
        // Scores spread over [−1, 1] with clusters, so blocks have very different sizes.
        let mut x: Vec<f64> = (0..400)
            .map(|i| ((i * 7919) % 400) as f64 / 200.0 - 1.0 + 1e-4 * (i % 3) as f64)
            .collect();
        x.sort_by(f64::total_cmp);
        for tau in [1e-4, 0.01, 0.5] {
            let table = ExpTable::new(&x, tau);
            for &sk in &[x[17], 0.0, x[399], 0.3] {
                let edge = crate::losses::surrogate::SIGMOID_CLAMP * tau;
                let lo = x.partition_point(|&v| v - sk < -edge);
                let hi = x.partition_point(|&v| v - sk <= edge);
                let mut deriv = Vec::new();
                let got = sigmoid_run(&table, &x, sk, tau, lo..hi, Some(&mut deriv));
                let mut want = 0.0;
                for (i, &v) in x[lo..hi].iter().enumerate() {
                    let (s, d) = crate::losses::surrogate::sigmoid_value_derivative(v - sk, tau);
                    want += s;
                    assert!((deriv[i] - d).abs() <= 1e-13 * d.max(1e-300), "{tau} {v}");
                }
                assert!(
                    (got - want).abs() <= 1e-14 * want.max(1.0),
                    "{tau}: {got} {want}"
                );
            }
        }
    }

    #[test]
    fn gallop_finds_the_partition_point_from_any_start() {
        let x: Vec<f64> = (0..37).map(|i| (i / 3) as f64).collect();
        for b in [-1.0, 0.0, 4.5, 5.0, 11.0, 20.0] {
            let want = x.partition_point(|&v| v < b);
            for from in 0..=want {
                assert_eq!(gallop(&x, from, |v| v < b), want, "b {b} from {from}");
            }
        }
        assert_eq!(gallop(&[], 0, |_| true), 0);
    }

    #[test]
    fn problem_validation_names_the_field() {
        let e = RankProblem::new(1, 2, 1, vec![0, 3], vec![0.0, 1.0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("level 3"), "{e}");
        let e = RankProblem::new(1, 2, 1, vec![0, 1], vec![0.5, 1.0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("relevance"), "{e}");
        assert!(RankProblem::new(1, 2, 1, vec![0], vec![0.0, 1.0]).is_err());
    }

    #[test]
    fn binary_problem_marks_the_query() {
        let y = Labels::from_fine(&[3, 3, 4]).unwrap();
        let p = RankProblem::binary(&y, false).unwrap();
        assert_eq!(p.levels_row(0), &[EXCLUDED, 1, 0]);
        assert!(!p.has_positive(2));
        let p = RankProblem::binary(&y, true).unwrap();
        assert_eq!(p.levels_row(2), &[0, 0, 1]);
        assert!(p.has_positive(2));
    }

    #[test]
    fn batch_problems_equal_their_definition_pair_by_pair() {
        // The builders compare whole columns at once; the definition is `labels.level(q, j)`,
        // the query left out (or not), and each query's relevance from the level populations
        // of the others.
        let mut s = 7u64;
        let mut draw = |k: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % k) as i64
        };
        for levels in 1..=3usize {
            for b in [1usize, 2, 13, 40] {
                // Each coarser class groups two finer ones: items of other fine classes match
                // at every level below.
                let rows: Vec<Vec<i64>> = (0..b)
                    .map(|_| {
                        let fine = draw(9);
                        (0..levels).map(|l| fine >> l).collect()
                    })
                    .collect();
                let labels = Labels::new(rows).unwrap();
                let rel = Relevance::default();
                for include_self in [false, true] {
                    let out = |q: usize, j: usize, l: u8| {
                        if q == j && !include_self {
                            EXCLUDED
                        } else {
                            l
                        }
                    };
                    let h = RankProblem::hierarchical(&labels, include_self, &rel).unwrap();
                    let bin = RankProblem::binary(&labels, include_self).unwrap();
                    for q in 0..b {
                        let want: Vec<u8> = (0..b).map(|j| out(q, j, labels.level(q, j))).collect();
                        assert_eq!(h.levels_row(q), want, "L={levels} B={b} q={q}");
                        let others: Vec<u8> = (0..b)
                            .filter(|&j| j != q)
                            .map(|j| labels.level(q, j))
                            .collect();
                        let counts = crate::hierarchy::level_counts(&others, levels);
                        assert_eq!(h.relevance_row(q), rel.level_values(&counts));
                        let fine: Vec<u8> = (0..b)
                            .map(|j| out(q, j, u8::from(labels.fine(q) == labels.fine(j))))
                            .collect();
                        assert_eq!(bin.levels_row(q), fine);
                    }
                }
            }
        }
    }
}

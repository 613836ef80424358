//! Exact retrieval evaluation: every query ranked against every reference, in chunks.
//!
//! The engine never materialises the `N_q × N_r` similarity matrix. For a chunk of queries it
//! computes the `chunk × N_r` scores with one matrix product (candle: the GPU with the `cuda`
//! feature, a multi-threaded GEMM on CPU), ranks each row completely with a radix sort
//! ([`order`]), turns the ranking into the row's list of levels of match, scores that list with
//! the pure functions of [`crate::metrics`], and drops the chunk. Memory is
//! `O(chunk × N_r)` plus one value per query and metric; rows are processed in parallel with
//! rayon. On a device, the next chunk is computed and copied to the host (into page-locked
//! buffers, [`pinned`]) while the host ranks the current one; on a CUDA device the evaluation of
//! embeddings ([`evaluate`]) has the device rank too ([`device_rank`]): only each query's
//! positives' positions come back, and the host computes the metrics from them.
//!
//! Ties are broken by reference index (see [`order`]), and per-query values are reduced in query
//! order, so results are bit-identical for every chunk size and thread count.

pub mod device_rank;
pub mod dyml;
pub mod ensemble;
mod knn;
pub mod order;
pub mod paired;
pub mod pinned;
mod positives;

pub use knn::{knn, knn_with, Knn};
pub use paired::{paired_differences, PairedDifference};

use crate::cpu::gemm::{gemm_into, transposed, Matrix};
use crate::cpu::with_values;
use crate::error::{Error, Result};
use crate::hierarchy::{Labels, Relevance};
use crate::metrics;
use crate::progress::Progress;
use candle_core::{DType, Device, Tensor};
use positives::{rank_row, PositivesScratch};
use rayon::prelude::*;
use serde::Serialize;

/// How the query itself appears among the references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum SelfMatch {
    /// Queries and references are disjoint sets (DyML query/gallery, revisited Oxford).
    #[default]
    None,
    /// The queries *are* the references (query `i` is reference `i`): reference `i` is removed
    /// from query `i`'s list. This is the SOP/iNat/CUB protocol ("embeddings come from the same
    /// source" in pytorch-metric-learning; `get_knn` dropping the query in HAPPIER's code).
    SameIndex,
    /// pytorch-metric-learning's `ref_includes_query = True` for separate query and reference
    /// sets: the top-ranked reference of each query is assumed to be the query and dropped.
    DropFirst,
}

/// How a query and a reference are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Similarity {
    /// Cosine similarity: both sides are L2-normalised first (what every paper's evaluation does).
    #[default]
    Cosine,
    /// Raw inner product `q · r` (faiss `IndexFlatIP`).
    InnerProduct,
    /// Negative squared Euclidean distance `−‖q − r‖²` (faiss `IndexFlatL2`); equal to the
    /// cosine ranking for unit vectors.
    Euclidean,
}

/// Which metrics to compute and how.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The `k` of R@k (recall rate: a positive in the top k) and P@k. SOP uses 1, 10, 100, 1000.
    pub recall_ks: Vec<usize>,
    /// Relevance function of H-AP.
    pub relevance: Relevance,
    /// Queries per chunk; the working set is `chunk_size × N_r` scores (one buffer, reused from
    /// chunk to chunk). The default, 512, amortises the product's packing of the references
    /// over more queries: SOP-scale kNN 24.0 s against 27.3 s with 128 in neighbouring runs
    /// on a 2-core AVX-512 VM (benches/eval_sop.rs), for a 124 MB buffer instead of 31 MB.
    pub chunk_size: usize,
    /// How the query appears among the references.
    pub self_match: SelfMatch,
    /// The score used to rank.
    pub similarity: Similarity,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Compute H-AP, ASI and NDCG, and the binary ASI of each label column evaluated.
    pub hierarchical: bool,
    /// Compute the binary metrics at every level (positives = same class at that label column),
    /// not only at the fine level.
    pub per_level: bool,
    /// Device of the matrix products. On a CUDA device the device also ranks
    /// ([`device_rank`]: only the positives' positions come back to the host), else the host's
    /// cores rank the scores.
    pub device: Device,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            recall_ks: vec![1, 10, 100, 1000],
            relevance: Relevance::default(),
            chunk_size: 512,
            self_match: SelfMatch::SameIndex,
            similarity: Similarity::Cosine,
            progress: false,
            hierarchical: true,
            per_level: true,
            device: Device::Cpu,
        }
    }
}

impl EvalOptions {
    /// Errors on options no evaluation can run with: a relevance that does not fit `num_levels`
    /// label levels, a chunk of 0 queries, a `k` of 0.
    pub fn validate(&self, num_levels: usize) -> Result<()> {
        self.relevance.validate(num_levels)?;
        if self.chunk_size == 0 {
            return Err(Error::invalid("chunk_size", "must be at least 1"));
        }
        if let Some(&k) = self.recall_ks.iter().find(|&&k| k == 0) {
            return Err(Error::invalid(
                "recall_ks",
                format!("k must be ≥ 1, got {k}"),
            ));
        }
        Ok(())
    }
}

/// One metric of a report, averaged over the queries that have a positive.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricRow {
    /// `"mAP"`, `"mAP@R"`, `"R-precision"`, `"R@k"`, `"P@k"`, `"H-AP"`, `"ASI"` or `"NDCG"`
    /// (`"ASI"` at a label column: that column's binary ASI, with hierarchical metrics on).
    pub metric: String,
    /// The label column a binary metric uses (0 = finest); `None` for the hierarchical metrics.
    pub level: Option<usize>,
    /// Mean over the counted queries (NaN if none was counted).
    pub value: f64,
    /// Number of queries counted.
    pub queries: usize,
    /// Number of lone queries skipped (no positive among the references).
    pub skipped: usize,
}

/// The result of [`evaluate`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// Number of queries evaluated.
    pub num_queries: usize,
    /// Number of references each query was ranked against (after removing itself).
    pub num_references: usize,
    /// The metrics, hierarchical first, then the binary ones per label column.
    pub rows: Vec<MetricRow>,
    /// Per-query values, `num_queries × rows.len()` row-major; NaN for a skipped query. Useful for
    /// paired significance tests between two models.
    #[serde(skip)]
    pub per_query: Vec<f64>,
}

impl EvalReport {
    /// The value of `metric` at label column `level` (`None` for hierarchical metrics).
    pub fn get(&self, metric: &str, level: Option<usize>) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.metric == metric && r.level == level)
            .map(|r| r.value)
    }
}

/// The metrics an evaluation reports besides `R@k` and `P@k` (one per `k` of its recall list).
pub const METRIC_NAMES: [&str; 6] = ["mAP", "mAP@R", "R-precision", "H-AP", "ASI", "NDCG"];

/// The metrics of [`METRIC_NAMES`] measured over all label levels at once (level `None`).
pub const HIERARCHICAL_METRICS: [&str; 3] = ["H-AP", "ASI", "NDCG"];

/// The metrics of [`METRIC_NAMES`] measured per label column (level `Some(c)`), as are `R@k` and
/// `P@k`. ASI is both: the hierarchical ASI and each column's binary ASI.
pub const BINARY_METRICS: [&str; 4] = ["mAP", "mAP@R", "R-precision", "ASI"];

/// The `k` of `R@k` or `P@k` (the metrics reported once per `k` of the recall list); `None` for
/// any other name.
///
/// ```
/// use rankwise::retrieval::cutoff_k;
/// assert_eq!((cutoff_k("R@4"), cutoff_k("P@1"), cutoff_k("mAP@R"), cutoff_k("R@x")), (Some(4), Some(1), None, None));
/// ```
pub fn cutoff_k(name: &str) -> Option<usize> {
    name.strip_prefix("R@")
        .or_else(|| name.strip_prefix("P@"))
        .and_then(|k| k.parse().ok())
}

/// A metric written `NAME` or `NAME:LEVEL` (`rankwise compare --metric`, `[validation]
/// metric`): the trimmed name and the level, if given. `None` when `LEVEL` is not a number.
///
/// ```
/// use rankwise::retrieval::split_metric_level;
/// assert_eq!(split_metric_level("mAP@R:1"), Some(("mAP@R", Some(1))));
/// assert_eq!(split_metric_level(" R@1 "), Some(("R@1", None)));
/// assert_eq!(split_metric_level("R@1:x"), None);
/// ```
pub fn split_metric_level(text: &str) -> Option<(&str, Option<usize>)> {
    let text = text.trim();
    match text.rsplit_once(':') {
        Some((name, level)) => Some((name.trim(), Some(level.trim().parse().ok()?))),
        None => Some((text, None)),
    }
}

/// One metric to compute on a ranked list of levels.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MetricKind {
    HAp,
    Asi,
    Ndcg,
    Map,
    MapAtR,
    RPrecision,
    RecallAt(usize),
    PrecisionAt(usize),
    /// ASI of one label column's binary problem (the DyML protocol's per-scale ASI).
    BinaryAsi,
}

#[derive(Debug, Clone, Copy)]
struct MetricSpec {
    kind: MetricKind,
    /// Label column for binary metrics (0 = finest).
    column: Option<usize>,
}

impl MetricSpec {
    fn name(&self) -> String {
        match self.kind {
            MetricKind::HAp => "H-AP".into(),
            MetricKind::Asi | MetricKind::BinaryAsi => "ASI".into(),
            MetricKind::Ndcg => "NDCG".into(),
            MetricKind::Map => "mAP".into(),
            MetricKind::MapAtR => "mAP@R".into(),
            MetricKind::RPrecision => "R-precision".into(),
            MetricKind::RecallAt(k) => format!("R@{k}"),
            MetricKind::PrecisionAt(k) => format!("P@{k}"),
        }
    }

    /// The metric of one query's ranked list (read through its positives); `None` if the query
    /// has no positive. `counts` holds the number of items of each level of the list.
    fn score(
        &self,
        ranked: &metrics::Positives<'_>,
        num_levels: usize,
        rel: &[f64],
        counts: &[usize],
    ) -> Option<f64> {
        // A label column c is a binary problem whose positives match on columns c..L, i.e.
        // have a level of match ≥ L − c.
        let min_level = self.column.map(|c| (num_levels - c) as u8).unwrap_or(1);
        let binary = || metrics::Binary::from_counts(ranked, min_level, counts);
        match self.kind {
            MetricKind::HAp => metrics::hierarchical::h_ap_of(ranked, rel),
            MetricKind::Asi => metrics::set_intersection::asi_of(ranked, counts, num_levels),
            MetricKind::Ndcg => metrics::discounted_gain::ndcg_of(ranked, counts),
            MetricKind::Map => binary().map(|b| b.average_precision()),
            MetricKind::MapAtR => binary().map(|b| b.map_at_r()),
            MetricKind::RPrecision => binary().map(|b| b.r_precision()),
            MetricKind::RecallAt(k) => binary().map(|b| b.recall_at_k(k)),
            MetricKind::PrecisionAt(k) => binary().and_then(|b| b.precision_at_k(k)),
            MetricKind::BinaryAsi => binary().map(|b| b.asi()),
        }
    }
}

fn plan(opts: &EvalOptions, num_levels: usize) -> Vec<MetricSpec> {
    let mut specs = Vec::new();
    if opts.hierarchical {
        for kind in [MetricKind::HAp, MetricKind::Asi, MetricKind::Ndcg] {
            specs.push(MetricSpec { kind, column: None });
        }
    }
    let columns = if opts.per_level { num_levels } else { 1 };
    for c in 0..columns {
        let mut kinds = vec![MetricKind::Map, MetricKind::MapAtR, MetricKind::RPrecision];
        kinds.extend(opts.recall_ks.iter().map(|&k| MetricKind::RecallAt(k)));
        kinds.extend(opts.recall_ks.iter().map(|&k| MetricKind::PrecisionAt(k)));
        if opts.hierarchical {
            // Beside the hierarchical ASI, each column's binary ASI: with mAP and R@1 per
            // column, the DyML protocol's per-scale metrics (HAPPIER Table 2) on one test set.
            // O(R) per query on the list of positives.
            kinds.push(MetricKind::BinaryAsi);
        }
        for kind in kinds {
            specs.push(MetricSpec {
                kind,
                column: Some(c),
            });
        }
    }
    specs
}

/// Checks an embedding matrix: 2-D, float, finite (shared by the engine and every loss).
/// `what` names it in errors; returns `(N, D)`.
pub fn check_embeddings(x: &Tensor, what: &str) -> Result<(usize, usize)> {
    let dims = check_matrix_shape(x, what)?;
    // A row sum propagates NaN and infinity (a max would silently skip NaN); f64 avoids
    // overflowing on large but finite values.
    use crate::cpu::host_sums::{host_f64, sum_abs, vectorised, with_host_values, HostValues};
    let d = dims.1.max(1);
    let borrowed = with_host_values(x, |v| {
        vectorised(
            #[inline(always)]
            || match v {
                HostValues::F32(s) => s.chunks(d).map(sum_abs).collect(),
                HostValues::F64(s) => s.chunks(d).map(sum_abs).collect(),
            },
        )
    });
    let row_sums: Vec<f64> = if let Some(sums) = borrowed {
        // On the host, a loop over the values where they lie: candle's element-wise ops on
        // large tensors wake its thread pool, whose spinning workers then slow the caller's
        // next parallel step.
        sums
    } else if x.device().is_cpu() {
        host_f64(x)?.chunks(d).map(sum_abs).collect()
    } else {
        x.to_dtype(DType::F64)?
            .abs()?
            .sum_keepdim(1)?
            .flatten_all()?
            .to_vec1::<f64>()?
    };
    if let Some(row) = row_sums.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid(
            what,
            format!("row {row} contains NaN or infinity"),
        ));
    }
    Ok(dims)
}

/// The part of [`check_embeddings`] that reads no value: 2-D and float. Returns `(N, D)`.
pub(crate) fn check_matrix_shape(x: &Tensor, what: &str) -> Result<(usize, usize)> {
    let dims = x.dims();
    if dims.len() != 2 {
        return Err(Error::Shape(format!(
            "{what} must be an N × D matrix, got shape {dims:?}"
        )));
    }
    if !x.dtype().is_float() {
        return Err(Error::invalid(
            what,
            format!("expected float embeddings, got {:?}", x.dtype()),
        ));
    }
    Ok((dims[0], dims[1]))
}

/// Each row of the `N × D` matrix `x` divided by its L2 norm, PyTorch's `F.normalize`:
/// `x / max(‖x‖₂, 1e-12)`.
pub(crate) fn normalise_rows(x: &Tensor) -> Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(1)?.sqrt()?.maximum(1e-12)?;
    Ok(x.broadcast_div(&norm)?)
}

/// Prepared query and reference matrices on the compute device, and the per-reference bias that
/// turns inner products into the chosen similarity.
pub(crate) struct Operands {
    pub queries: Tensor,
    /// `N_r × D`, row-major.
    pub references: Tensor,
    /// `1 × N_r`, added to every row of scores (`−‖r_j‖²/2` for Euclidean ranking).
    pub column_bias: Option<Tensor>,
    pub num_queries: usize,
    pub num_references: usize,
    /// On the CPU, what the products read besides the queries (read in place): the references
    /// transposed (`D × N_r` row-major) and the bias; made at the first chunk (the re-rankers
    /// that only read `queries` and `references` never pay for them).
    host: std::sync::OnceLock<HostOperands>,
}

struct HostOperands {
    references_t: Vec<f32>,
    column_bias: Option<Vec<f32>>,
}

pub(crate) fn prepare(
    queries: &Tensor,
    references: &Tensor,
    similarity: Similarity,
    device: &Device,
) -> Result<Operands> {
    let (nq, dq) = check_embeddings(queries, "query embeddings")?;
    let (nr, dr) = check_embeddings(references, "reference embeddings")?;
    if dq != dr {
        return Err(Error::Shape(format!(
            "queries have dimension {dq} but references have dimension {dr}"
        )));
    }
    let q = queries.to_device(device)?.to_dtype(DType::F32)?;
    let r = references.to_device(device)?.to_dtype(DType::F32)?;
    let (q, r, column_bias) = match similarity {
        Similarity::Cosine => (normalise_rows(&q)?, normalise_rows(&r)?, None),
        Similarity::InnerProduct => (q, r, None),
        Similarity::Euclidean => {
            // −‖q − r‖² = 2 q·r − ‖r‖² − ‖q‖²; the last term is constant along a query's row,
            // so ranking by q·r − ‖r‖²/2 is the same ranking.
            let half_sq = (r.sqr()?.sum(1)? * -0.5)?.unsqueeze(0)?;
            (q, r, Some(half_sq))
        }
    };
    Ok(Operands {
        queries: q.contiguous()?,
        references: r.contiguous()?,
        column_bias,
        num_queries: nq,
        num_references: nr,
        host: std::sync::OnceLock::new(),
    })
}

/// Where the engine's scores come from: the `len × N_r` scores (row-major, larger = ranked
/// first) of a chunk of queries against every reference. Embeddings are one source (the
/// matrix product of [`evaluate`]); every re-ranker is another ([`crate::rerank::Reranker`]), so
/// that one engine ranks and scores them all ([`evaluate_scores`]).
pub trait ScoreSource: Sync {
    /// Number of queries.
    fn num_queries(&self) -> usize;
    /// Number of references.
    fn num_references(&self) -> usize;
    /// Writes the scores of queries `start..start + len` into `chunk`
    /// ([`ScoreChunk::set`]).
    fn chunk_scores(&self, start: usize, len: usize, chunk: &mut ScoreChunk) -> Result<()>;
    /// Whether every score is finite by construction (products of checked embeddings); when
    /// not, the engine checks each chunk and names the first non-finite score.
    fn finite_by_construction(&self) -> bool {
        false
    }
    /// Whether the source computes its chunks away from the host's cores (on a device): the
    /// engine then has the next chunk computed, and copied to the host, on a thread of its own
    /// while it ranks the current one. Sources that compute on the CPU keep the default (no):
    /// their products already use every core.
    fn computes_off_host(&self) -> bool {
        false
    }
}

/// The `len × N_r` scores of one chunk of queries, on the CPU: a buffer reused from chunk to
/// chunk (one allocation per evaluation, not a fresh mapping of up to a hundred megabytes, and
/// its page faults, per chunk), or the tensor a device computed.
/// With the `cuda` feature, a page-locked buffer too, into which a device's chunks are copied
/// ([`pinned`]).
#[derive(Default)]
pub struct ScoreChunk {
    host: Vec<f32>,
    device: Option<Tensor>,
    #[cfg(feature = "cuda")]
    pinned: pinned::PinnedScores,
}

impl ScoreChunk {
    /// Takes `scores` (row-major, `len × N_r`) as the chunk's scores.
    pub fn set(&mut self, scores: Vec<f32>) {
        self.host = scores;
        self.device = None;
        #[cfg(feature = "cuda")]
        self.pinned.clear();
    }

    /// Takes the scores a device computed (`len × N_r`): copied into the chunk's page-locked
    /// buffer when they are on a CUDA device and [`pinned::enabled`], else by candle.
    fn set_from_device(&mut self, scores: Tensor) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            self.pinned.clear();
            if scores.device().is_cuda()
                && scores.dtype() == DType::F32
                && scores.elem_count() > 0
                && pinned::enabled()
            {
                self.device = None;
                return self.pinned.copy_from(&scores.contiguous()?);
            }
        }
        self.device = Some(scores.to_device(&Device::Cpu)?.contiguous()?);
        Ok(())
    }

    /// Runs `f` on the row-major scores of the last chunk without copying them out of the
    /// tensor (a copy of a 512 × 60k chunk cost a fifth of the matrix product itself).
    pub(crate) fn with_slice<T>(&self, f: impl FnOnce(&[f32]) -> T) -> Result<T> {
        #[cfg(feature = "cuda")]
        if self.pinned.holds() {
            return Ok(f(self.pinned.values()?));
        }
        let Some(scores) = &self.device else {
            return Ok(f(&self.host));
        };
        let (storage, layout) = scores.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (candle_core::Storage::Cpu(cpu), Some((start, end))) => {
                Ok(f(&cpu.as_slice::<f32>()?[start..end]))
            }
            _ => {
                drop(storage);
                let v = scores.flatten_all()?.to_vec1::<f32>()?;
                Ok(f(&v))
            }
        }
    }
}

impl ScoreSource for Operands {
    fn num_queries(&self) -> usize {
        self.num_queries
    }
    fn num_references(&self) -> usize {
        self.num_references
    }
    fn chunk_scores(&self, start: usize, len: usize, chunk: &mut ScoreChunk) -> Result<()> {
        Operands::chunk_scores(self, start, len, chunk)
    }
    fn computes_off_host(&self) -> bool {
        // On a device whose threads do not share one stream, a chunk computed on another
        // thread would not be ordered with the caller's work: the chunks stay on this thread.
        let device = self.queries.device();
        !device.is_cpu() && crate::device::shared_stream(device)
    }
    fn finite_by_construction(&self) -> bool {
        true
    }
}

impl Operands {
    /// Scores of queries `start..start + len` against every reference, written to `chunk`.
    ///
    /// On the CPU one GEMM call writes them into the chunk's buffer, reading the references
    /// transposed (`D × N_r` row-major, copied once): the GEMM then packs its right operand
    /// with contiguous reads, where the transposed *view* of row-major references made it
    /// gather at a stride of `D` (a gemm 0.19 microbenchmark at SOP scale, 2 threads, AVX-512,
    /// 128–1024 queries per product: 175–215 against 125–185 GFLOP/s in two steady runs; the
    /// kNN times are in the README). On a device, candle's product, copied back.
    pub fn chunk_scores(&self, start: usize, len: usize, chunk: &mut ScoreChunk) -> Result<()> {
        if !self.queries.device().is_cpu() {
            return chunk.set_from_device(self.device_scores(start, len)?);
        }
        chunk.device = None;
        #[cfg(feature = "cuda")]
        chunk.pinned.clear();
        let host = self.host()?;
        let (nr, d) = (self.num_references, self.queries.dims2()?.1);
        chunk.host.resize(len * nr, 0.0);
        with_values::<f32, _>(&self.queries, |q| {
            gemm_into(
                &mut chunk.host,
                Matrix::row_major(&q[start * d..(start + len) * d], len, d),
                Matrix::row_major(&host.references_t, d, nr),
                false,
                rayon::current_num_threads(),
            );
            Ok(())
        })?;
        // (No references: nothing to add, and `par_chunks_mut(0)` would panic.)
        if let Some(bias) = host.column_bias.as_ref().filter(|_| nr > 0) {
            chunk.host.par_chunks_mut(nr).for_each(|row| {
                for (s, b) in row.iter_mut().zip(bias) {
                    *s += *b;
                }
            });
        }
        Ok(())
    }

    /// Scores of queries `start..start + len` against every reference, on the operands'
    /// device (not the CPU: there [`Operands::chunk_scores`] writes into a host buffer).
    fn device_scores(&self, start: usize, len: usize) -> Result<Tensor> {
        let mut s = self
            .queries
            .narrow(0, start, len)?
            .matmul(&self.references.t()?)?;
        if let Some(bias) = &self.column_bias {
            s = s.broadcast_add(bias)?;
        }
        Ok(s)
    }

    fn host(&self) -> Result<&HostOperands> {
        if let Some(h) = self.host.get() {
            return Ok(h);
        }
        let d = self.references.dims2()?.1;
        let made = HostOperands {
            references_t: with_values::<f32, _>(&self.references, |r| {
                Ok(transposed(r, self.num_references, d))
            })?,
            column_bias: match &self.column_bias {
                Some(b) => Some(b.flatten_all()?.to_vec1()?),
                None => None,
            },
        };
        Ok(self.host.get_or_init(|| made))
    }
}

/// Label columns of the references, coarsest first, so the level of match is a short loop that
/// stops at the first mismatch.
struct ReferenceLevels {
    columns_coarse_first: Vec<Vec<i64>>,
}

impl ReferenceLevels {
    fn new(labels: &Labels) -> Self {
        let l = labels.num_levels();
        ReferenceLevels {
            columns_coarse_first: (0..l).rev().map(|c| labels.column(c)).collect(),
        }
    }

    #[inline]
    fn level(&self, query_coarse_first: &[i64], j: usize) -> u8 {
        let mut level = 0u8;
        for (col, &q) in self.columns_coarse_first.iter().zip(query_coarse_first) {
            if col[j] != q {
                break;
            }
            level += 1;
        }
        level
    }
}

/// Exact evaluation of `queries` against `references` (or against themselves when `None`).
///
/// With `references = None` the queries are their own reference set and
/// [`EvalOptions::self_match`] should be [`SelfMatch::SameIndex`] (the default) so that each
/// query is removed from its own list. Errors on shape mismatches, NaN/inf embeddings, label
/// counts that differ from embedding counts and invalid relevance parameters.
pub fn evaluate(
    queries: &Tensor,
    query_labels: &Labels,
    references: Option<(&Tensor, &Labels)>,
    opts: &EvalOptions,
) -> Result<EvalReport> {
    let (ref_emb, ref_labels) = references.unwrap_or((queries, query_labels));
    // Options and labels first: a mistake there fails before the embeddings are prepared.
    query_labels.check_compatible(ref_labels)?;
    opts.validate(query_labels.num_levels())?;
    let ops = prepare(queries, ref_emb, opts.similarity, &opts.device)?;
    score_all(
        &ops,
        Some(&ops),
        query_labels,
        ref_labels,
        opts,
        ["query embeddings", "reference embeddings"],
    )
}

/// Errors unless `scores` holds the `len × nr` scores of queries `start..start + len`, and,
/// with `check_finite`, names the first non-finite one (its query and reference): what the
/// engine and the re-rankers' rankings ([`crate::rerank::rankings`]) ask of a chunk.
pub(crate) fn check_chunk_scores(
    scores: &[f32],
    start: usize,
    len: usize,
    nr: usize,
    check_finite: bool,
) -> Result<()> {
    if scores.len() != len * nr {
        return Err(Error::Shape(format!(
            "{} scores for {len} queries × {nr} references",
            scores.len()
        )));
    }
    if check_finite {
        if let Some(bad) = scores.par_iter().position_first(|s| !s.is_finite()) {
            return Err(Error::invalid(
                "scores",
                format!(
                    "query {}, reference {}: non-finite score",
                    start + bad / nr,
                    bad % nr
                ),
            ));
        }
    }
    Ok(())
}

/// The engine behind [`evaluate`] for any [`ScoreSource`]: each chunk of queries is scored by
/// the source, every row ranked completely (ties by reference index), and the metrics of
/// `opts` computed on the ranked levels of match against `ref_labels` (the query labels
/// themselves when the queries are the references, with [`EvalOptions::self_match`] saying how
/// a query appears in its own list). [`EvalOptions::similarity`] and [`EvalOptions::device`]
/// belong to the source and are not read here.
///
/// Errors if the label counts differ from the source's sizes, on invalid options, and on a
/// non-finite score (naming the query and reference).
pub fn evaluate_scores<S: ScoreSource + ?Sized>(
    source: &S,
    query_labels: &Labels,
    ref_labels: &Labels,
    opts: &EvalOptions,
) -> Result<EvalReport> {
    query_labels.check_compatible(ref_labels)?;
    opts.validate(query_labels.num_levels())?;
    score_all(
        source,
        None,
        query_labels,
        ref_labels,
        opts,
        ["queries", "references"],
    )
}

/// [`evaluate_scores`] once the labels and options are checked; `names` are what the errors
/// call the source's queries and references. `embeddings`: the source when it is the product of
/// embeddings, whose scores a CUDA device can rank itself ([`device_rank`]).
fn score_all<S: ScoreSource + ?Sized>(
    source: &S,
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))] embeddings: Option<&Operands>,
    query_labels: &Labels,
    ref_labels: &Labels,
    opts: &EvalOptions,
    names: [&str; 2],
) -> Result<EvalReport> {
    let num_levels = query_labels.num_levels();
    let (num_queries, nr) = (source.num_queries(), source.num_references());
    if num_queries != query_labels.len() {
        return Err(Error::Shape(format!(
            "{num_queries} {} but {} query label rows",
            names[0],
            query_labels.len()
        )));
    }
    if nr != ref_labels.len() {
        return Err(Error::Shape(format!(
            "{nr} {} but {} reference label rows",
            names[1],
            ref_labels.len()
        )));
    }
    if opts.self_match == SelfMatch::SameIndex && num_queries > nr {
        return Err(Error::invalid(
            "self_match",
            "SameIndex needs query i to be reference i, but there are more queries than references",
        ));
    }
    let specs = plan(opts, num_levels);
    let m = specs.len();
    let refs = ReferenceLevels::new(ref_labels);
    let query_rows: Vec<Vec<i64>> = (0..num_queries)
        .map(|i| query_labels.row(i).iter().rev().copied().collect())
        .collect();
    let mut per_query = vec![f64::NAN; num_queries * m];
    let pb = Progress::new(num_queries, "queries", "evaluating", opts.progress);
    let same_index = opts.self_match == SelfMatch::SameIndex;
    let drop_first = opts.self_match == SelfMatch::DropFirst;
    // One query's metrics from its ranked row.
    let score_row = |out: &mut [f64], scratch: &PositivesScratch| {
        let (ranked, counts) = (scratch.ranked(), scratch.counts());
        let rel = if opts.hierarchical {
            opts.relevance.level_values(counts)
        } else {
            Vec::new()
        };
        for (o, spec) in out.iter_mut().zip(&specs) {
            *o = spec
                .score(&ranked, num_levels, &rel, counts)
                .unwrap_or(f64::NAN);
        }
    };
    #[cfg(feature = "cuda")]
    if let Some(ops) = embeddings {
        let min_level = lowest_level_read(&specs, num_levels);
        let ranker = device_rank::plan(
            ops.queries.device(),
            &refs,
            &query_rows,
            min_level,
            same_index,
            opts.chunk_size,
        )?;
        if let Some(ranker) = ranker {
            // The query itself is among the references with `SameIndex` (checked above).
            let list_len = nr - usize::from(same_index);
            pipeline(
                num_queries,
                opts.chunk_size,
                true,
                |start, len, ranked: &mut device_rank::RankedChunk| {
                    ranker
                        .rank(&ops.device_scores(start, len)?, start, len, ranked)
                        .map_err(|e| {
                            // The way around a failure of the kernels, named where it shows.
                            Error::invalid(
                                "device ranking",
                                format!(
                                    "queries {start}..{}: {e} (RANKWISE_DEVICE_RANKING=0 ranks \
                                     on the host instead)",
                                    start + len
                                ),
                            )
                        })
                },
                |start, len, ranked| {
                    per_query[start * m..(start + len) * m]
                        .par_chunks_mut(m)
                        .enumerate()
                        .for_each_init(PositivesScratch::default, |scratch, (r, out)| {
                            let (positions, levels) = ranked.row(r);
                            scratch.set_ranked(positions, levels, list_len, num_levels, drop_first);
                            score_row(out, scratch);
                        });
                    pb.inc(len as u64);
                    Ok(())
                },
            )?;
            pb.finish();
            return Ok(finish_report(
                &specs,
                per_query,
                num_queries,
                nr,
                opts.self_match,
            ));
        }
    }
    // Ranks and scores the queries of one chunk into `per_query`.
    let mut rank_chunk = |start: usize, len: usize, chunk: &ScoreChunk| -> Result<()> {
        chunk.with_slice(|scores| {
            check_chunk_scores(scores, start, len, nr, !source.finite_by_construction())?;
            per_query[start * m..(start + len) * m]
                .par_chunks_mut(m)
                .zip(scores.par_chunks(nr))
                .enumerate()
                .for_each_init(PositivesScratch::default, |scratch, (r, (out, row))| {
                    let qi = start + r;
                    let query = &query_rows[qi];
                    rank_row(
                        row,
                        |j| refs.level(query, j),
                        num_levels,
                        same_index.then_some(qi),
                        drop_first,
                        scratch,
                    );
                    score_row(out, scratch);
                });
            Ok::<(), Error>(())
        })??;
        pb.inc(len as u64);
        Ok(())
    };
    for_each_chunk(source, opts.chunk_size, &mut rank_chunk)?;
    pb.finish();
    Ok(finish_report(
        &specs,
        per_query,
        num_queries,
        nr,
        opts.self_match,
    ))
}

/// The lowest level of match that one of `specs` reads: 1 with a hierarchical metric, else that
/// of the finest binary problem (label column `c` reads levels ≥ `L − c`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn lowest_level_read(specs: &[MetricSpec], num_levels: usize) -> u8 {
    specs
        .iter()
        .map(|s| s.column.map_or(1, |c| (num_levels - c) as u8))
        .min()
        .unwrap_or(1)
        .max(1)
}

/// The report of an evaluation from its per-query values.
fn finish_report(
    specs: &[MetricSpec],
    per_query: Vec<f64>,
    num_queries: usize,
    nr: usize,
    self_match: SelfMatch,
) -> EvalReport {
    let rows = reduce(specs, &per_query, num_queries);
    let num_references = match self_match {
        SelfMatch::None => nr,
        SelfMatch::SameIndex | SelfMatch::DropFirst => nr.saturating_sub(1),
    };
    EvalReport {
        num_queries,
        num_references,
        rows,
        per_query,
    }
}

/// Scores the queries of `source` in chunks of `chunk_size` (at least 1) and hands each chunk,
/// in query order, to `f(start, len, scores)`; stops at the first error.
///
/// A source that [computes off the host](ScoreSource::computes_off_host) has chunk `k + 1`
/// computed and copied back on a thread of its own while `f` works on chunk `k` with the host's
/// cores: the device's product and the copy leave the critical path. The chunks reach `f` in
/// the same order either way, so the results are those of the plain loop.
pub(crate) fn for_each_chunk<S: ScoreSource + ?Sized>(
    source: &S,
    chunk_size: usize,
    f: impl FnMut(usize, usize, &ScoreChunk) -> Result<()>,
) -> Result<()> {
    pipeline(
        source.num_queries(),
        chunk_size,
        source.computes_off_host(),
        |start, len, chunk: &mut ScoreChunk| source.chunk_scores(start, len, chunk),
        f,
    )
}

/// The chunks of `n` queries (`chunk_size`, at least 1, per chunk), each made by
/// `produce(start, len, chunk)` and handed to `consume(start, len, chunk)` in query order;
/// stops at the first error. With `overlap`, `produce` runs on a thread of its own, one chunk
/// ahead of `consume`, and the chunks' buffers circulate between the two (at most three). On a
/// CUDA device both threads queue on the device's one stream ([`crate::device::shared_stream`],
/// which a source's `computes_off_host` requires), so the product reads embeddings the
/// caller's work has finished writing.
fn pipeline<T: Default + Send>(
    n: usize,
    chunk_size: usize,
    overlap: bool,
    produce: impl Fn(usize, usize, &mut T) -> Result<()> + Sync,
    mut consume: impl FnMut(usize, usize, &T) -> Result<()>,
) -> Result<()> {
    let chunks: Vec<(usize, usize)> = (0..n)
        .step_by(chunk_size.max(1))
        .map(|start| (start, chunk_size.max(1).min(n - start)))
        .collect();
    let f = &mut consume;
    if !overlap || chunks.len() < 2 {
        let mut chunk = T::default();
        for &(start, len) in &chunks {
            produce(start, len, &mut chunk)?;
            f(start, len, &chunk)?;
        }
        return Ok(());
    }
    let produce = &produce;
    std::thread::scope(|scope| {
        // Capacity 1: at most one chunk waits while one is consumed and one is produced.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(usize, usize, T)>>(1);
        // Consumed chunks go back to be refilled: their buffers (page-locked ones, whose
        // allocation is slow, on a CUDA device) are allocated once per evaluation, at most three.
        let (back_tx, back_rx) = std::sync::mpsc::channel::<T>();
        let chunks = &chunks;
        scope.spawn(move || {
            for &(start, len) in chunks {
                let mut chunk = back_rx.try_recv().unwrap_or_default();
                let item = produce(start, len, &mut chunk).map(|()| (start, len, chunk));
                let failed = item.is_err();
                // A closed channel: `f` stopped on an error of its own.
                if tx.send(item).is_err() || failed {
                    return;
                }
            }
        });
        for item in rx {
            let (start, len, chunk) = item?;
            f(start, len, &chunk)?;
            // The computing thread may have finished: the chunk is then dropped here.
            let _ = back_tx.send(chunk);
        }
        Ok(())
    })
}

/// Means over queries, in query order (deterministic), skipping NaN (lone queries).
fn reduce(specs: &[MetricSpec], per_query: &[f64], nq: usize) -> Vec<MetricRow> {
    let m = specs.len();
    specs
        .iter()
        .enumerate()
        .map(|(s, spec)| {
            let (mut sum, mut count) = (0.0f64, 0usize);
            for q in 0..nq {
                let v = per_query[q * m + s];
                if !v.is_nan() {
                    sum += v;
                    count += 1;
                }
            }
            MetricRow {
                metric: spec.name(),
                level: spec.column,
                value: if count > 0 {
                    sum / count as f64
                } else {
                    f64::NAN
                },
                queries: count,
                skipped: nq - count,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The names other modules check a metric against (`validation.metric`, `rankwise compare
    /// --metric`) are the names an evaluation reports.
    #[test]
    fn metric_names_are_the_names_an_evaluation_reports() {
        let labels = Labels::new(vec![vec![0, 5], vec![0, 5], vec![1, 5], vec![2, 6]]).unwrap();
        let x = Tensor::from_vec(
            vec![1.0f32, 0.0, 0.9, 0.1, 0.5, 0.5, 0.0, 1.0],
            (4, 2),
            &Device::Cpu,
        )
        .unwrap();
        let opts = EvalOptions {
            recall_ks: vec![1, 2],
            progress: false,
            ..EvalOptions::default()
        };
        let report = evaluate(&x, &labels, None, &opts).unwrap();
        let mut named: Vec<&str> = Vec::new();
        for row in &report.rows {
            let name = row.metric.as_str();
            let fixed = METRIC_NAMES.contains(&name);
            let k = cutoff_k(name);
            assert!(fixed || k.is_some_and(|k| k == 1 || k == 2), "{name}");
            match row.level {
                None => assert!(HIERARCHICAL_METRICS.contains(&name), "{name}"),
                Some(_) => assert!(BINARY_METRICS.contains(&name) || k.is_some(), "{name}"),
            }
            if fixed && !named.contains(&name) {
                named.push(name);
            }
        }
        named.sort();
        let mut all = METRIC_NAMES.to_vec();
        all.sort();
        assert_eq!(named, all, "every listed name is reported");
        for name in BINARY_METRICS {
            assert!(report.get(name, Some(1)).is_some(), "{name} per column");
        }
        for name in HIERARCHICAL_METRICS {
            assert!(report.get(name, None).is_some(), "{name} over the levels");
        }
    }

    /// Chunks of `i + j` scores "computed off the host", counting the chunks that arrive
    /// without a buffer (fresh) rather than recycled.
    struct Counting {
        n: usize,
        fresh: AtomicUsize,
    }

    impl ScoreSource for Counting {
        fn num_queries(&self) -> usize {
            self.n
        }
        fn num_references(&self) -> usize {
            3
        }
        fn chunk_scores(&self, start: usize, len: usize, chunk: &mut ScoreChunk) -> Result<()> {
            if chunk.host.capacity() == 0 {
                self.fresh.fetch_add(1, Ordering::SeqCst);
            }
            // Slow enough that the ranking side often waits, fast enough for a unit test.
            std::thread::sleep(std::time::Duration::from_micros(200));
            let mut v = std::mem::take(&mut chunk.host);
            v.clear();
            v.extend((start..start + len).flat_map(|q| (0..3).map(move |j| (q + j) as f32)));
            chunk.set(v);
            Ok(())
        }
        fn computes_off_host(&self) -> bool {
            true
        }
    }

    #[test]
    fn prefetched_chunks_arrive_in_order_and_their_buffers_are_reused() {
        for sleep_us in [0, 300] {
            let source = Counting {
                n: 61,
                fresh: AtomicUsize::new(0),
            };
            let mut seen = Vec::new();
            for_each_chunk(&source, 2, |start, len, chunk| {
                std::thread::sleep(std::time::Duration::from_micros(sleep_us));
                chunk.with_slice(|s| {
                    let want: Vec<f32> = (start..start + len)
                        .flat_map(|q| (0..3).map(move |j| (q + j) as f32))
                        .collect();
                    assert_eq!(s, &want[..]);
                })?;
                seen.push((start, len));
                Ok(())
            })
            .unwrap();
            let want: Vec<(usize, usize)> =
                (0..61).step_by(2).map(|s| (s, 2.min(61 - s))).collect();
            assert_eq!(seen, want);
            // One chunk ranked, one waiting in the channel, one being computed: never more
            // than three buffers, whatever the two sides' speeds.
            let fresh = source.fresh.load(Ordering::SeqCst);
            assert!((1..=3).contains(&fresh), "{fresh} buffers allocated");
        }
    }
}

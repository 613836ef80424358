//! The engine behind every loss that decomposes over the rows of the batch similarity matrix
//! (FastAP, RaMBO, contrastive, triplet): each query's term depends only on its own row
//! `S[q, ·]` of `S = Ê Êᵀ`, and the batch loss is a reduction of those terms.
//!
//! Why not plain autograd: autograd keeps every intermediate of every chunk alive until the
//! backward pass, so a chunked forward still holds `O(B²)` (FastAP's soft histograms:
//! `O(L·B²)`) tensors. Here the forward pass computes `S` one chunk of query rows at a time
//! (`chunk × B`), reduces each row to a small summary and drops the chunk. The backward pass
//! recomputes the same chunks, asks the loss for the exact derivative `∂loss/∂S[q, ·]` of each
//! row, and folds it into `∂loss/∂Ê = G Ê + Gᵀ Ê` chunk by chunk. The working set is
//! `O(chunk × B)` in both passes, and the result does not depend on the chunk size (up to the
//! rounding of the final sums). Without chunking (one chunk of `B` rows) the forward pass keeps
//! `S` for the backward pass, which then needs a single product `(G + Gᵀ) Ê`.
//!
//! The value is attached to the autograd graph by a [`CustomOp2`] whose forward is a copy of the
//! precomputed value, so the op runs on every candle device: the similarity products use the
//! device of the embeddings and only the `chunk × B` rows travel to the CPU for the per-row
//! logic (in `f64`, in parallel over rows with rayon).

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp2, DType, Device, Layout, MetalStorage, Shape, Tensor,
};
use rayon::prelude::*;
use std::sync::Arc;

/// How two L2-normalised embeddings are compared by the pair and triplet losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairMetric {
    /// Cosine similarity `s = êᵢ·êⱼ` (pytorch-metric-learning's `DotProductSimilarity` on
    /// normalised embeddings; what ROADMAP, HAPPIER and SupRank use for their baselines).
    /// Larger is closer.
    Cosine,
    /// Euclidean distance `d = ‖êᵢ − êⱼ‖ = √(2 − 2s)` (pytorch-metric-learning's default
    /// `LpDistance(normalize_embeddings=True, p=2)`). Smaller is closer. At `d = 0` (duplicate
    /// embeddings) the derivative of `d` is taken as 0, as torch's `cdist` does.
    Euclidean,
}

impl PairMetric {
    /// The pair's *distance-like* value `x` (smaller is closer) from the cosine similarity `s`:
    /// `−s` for [`PairMetric::Cosine`] (negation is exact, so `x_p − x_n = s_n − s_p` bit for
    /// bit), `√max(2 − 2s, 0)` for [`PairMetric::Euclidean`].
    pub fn distance(self, s: f64) -> f64 {
        match self {
            PairMetric::Cosine => -s,
            PairMetric::Euclidean => (2.0 - 2.0 * s).max(0.0).sqrt(),
        }
    }

    /// `dx/ds` at the distance-like value `x` (see [`PairMetric::distance`]).
    pub fn distance_slope(self, x: f64) -> f64 {
        match self {
            PairMetric::Cosine => -1.0,
            // x = √(2 − 2s) ⇒ dx/ds = −1/x; torch's cdist returns a zero gradient at x = 0.
            PairMetric::Euclidean => {
                if x > 0.0 {
                    -1.0 / x
                } else {
                    0.0
                }
            }
        }
    }
}

/// Errors unless every row of `embeddings` has unit L2 norm within `tolerance` (for losses run
/// with `normalize = false`, whose formulas assume unit vectors).
pub fn check_unit_rows(embeddings: &Tensor, tolerance: f64) -> Result<()> {
    let norms = embeddings
        .to_dtype(DType::F64)?
        .sqr()?
        .sum_keepdim(1)?
        .sqrt()?
        .flatten_all()?
        .to_vec1::<f64>()?;
    if let Some((row, n)) = norms
        .iter()
        .enumerate()
        .find(|(_, n)| (**n - 1.0).abs() > tolerance)
    {
        return Err(Error::invalid(
            "embeddings",
            format!(
                "row {row} has L2 norm {n}; with normalize = false the loss needs unit vectors \
                 (|norm − 1| ≤ {tolerance})"
            ),
        ));
    }
    Ok(())
}

/// Validates a `query_chunk` option and returns the chunk size for a batch of `b` rows
/// (`None` = the whole batch at once).
pub fn chunk_size(query_chunk: Option<usize>, b: usize) -> Result<usize> {
    match query_chunk {
        Some(0) => Err(Error::invalid("query_chunk", "must be at least 1")),
        Some(c) => Ok(c.min(b).max(1)),
        None => Ok(b.max(1)),
    }
}

/// The fine class id of every item (column 0). In a validated hierarchy two items share every
/// level exactly when they share the fine class, so "same fine class" is the positive relation
/// of the flat losses (`level == L`).
pub fn fine_ids(labels: &Labels) -> Arc<Vec<ClassId>> {
    Arc::new(labels.column(0))
}

/// Per-query logic of a loss that decomposes over the rows of `S = Ê Êᵀ`.
///
/// `sims` is the full row `S[q, 0..B]`, the query's own entry `S[q, q]` included; each loss
/// decides whether the query takes part in its own retrieval set.
pub(crate) trait RowLoss: Send + Sync + 'static {
    /// What the value pass keeps of one row (e.g. the row's loss term and counts).
    type Row: Send + Sync + 'static;
    /// What the whole batch contributes to every row's gradient (e.g. the number of active
    /// pairs of an average-over-non-zero reduction).
    type Global: Send + Sync + 'static;

    /// Summary of query `q`'s row.
    fn summarise(&self, q: usize, sims: &[f64]) -> Self::Row;

    /// Batch-level quantities from the summaries of all rows, in query order. Errors when the
    /// loss is undefined for this batch (e.g. no query has a positive).
    fn global(&self, rows: &[Self::Row]) -> Result<Self::Global>;

    /// The loss value.
    fn value(&self, global: &Self::Global) -> f64;

    /// Writes `upstream · ∂loss/∂S[q, ·]` into `out` (length `B`, zero-initialised).
    ///
    /// `upstream` is the gradient arriving at the scalar loss (1 for a plain `backward`); it is
    /// passed in rather than multiplied afterwards because RaMBO's blackbox gradient is not
    /// linear in it (Algorithm 1 perturbs the scores by `λ · upstream · ∂loss/∂rk`).
    fn row_grad(
        &self,
        q: usize,
        sims: &[f64],
        row: &Self::Row,
        global: &Self::Global,
        upstream: f64,
        out: &mut [f64],
    );
}

/// Computes a [`RowLoss`] over the unit-norm embeddings `e_unit` (`B × D`, part of the autograd
/// graph) in chunks of `chunk` query rows. Returns the scalar loss (dtype and device of
/// `e_unit`) and the row summaries of the value pass.
pub(crate) fn row_loss<R: RowLoss>(
    e_unit: &Tensor,
    loss: R,
    chunk: usize,
) -> Result<(Tensor, Arc<Vec<R::Row>>)> {
    let e = e_unit.detach();
    let (b, _) = e.dims2()?;
    let loss = Arc::new(loss);
    let mut rows: Vec<R::Row> = Vec::with_capacity(b);
    let mut cached = None;
    for start in (0..b).step_by(chunk) {
        let len = chunk.min(b - start);
        let sims = chunk_similarities(&e, start, len)?;
        let summaries: Vec<R::Row> = sims
            .par_chunks(b)
            .enumerate()
            .map(|(i, row)| loss.summarise(start + i, row))
            .collect();
        rows.extend(summaries);
        if len == b {
            // Unchunked: the caller accepted an O(B²) working set, so keep S for the backward
            // pass instead of recomputing it.
            cached = Some(Arc::new(sims));
        }
    }
    let rows = Arc::new(rows);
    let global = Arc::new(loss.global(&rows)?);
    let value = loss.value(&global);
    let value = Tensor::new(value, e.device())?.to_dtype(e.dtype())?;
    let op = RowLossOp {
        loss,
        rows: rows.clone(),
        global,
        chunk,
        cached,
    };
    let out = e_unit.apply_op2_arc(&value, Arc::new(Box::new(op)))?;
    Ok((out, rows))
}

/// `S[start..start+len, ·]` as row-major `f64` (the product runs on the embeddings' device and
/// dtype, like the authors' `x @ x.T`).
fn chunk_similarities(e: &Tensor, start: usize, len: usize) -> Result<Vec<f64>> {
    let eq = e.narrow(0, start, len)?;
    let sims = eq.matmul(&e.t()?)?;
    Ok(sims.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// The custom op that carries a [`RowLoss`] value in the graph. Its forward copies the
/// precomputed scalar (second argument); its backward recomputes the chunks.
struct RowLossOp<R: RowLoss> {
    loss: Arc<R>,
    rows: Arc<Vec<R::Row>>,
    global: Arc<R::Global>,
    chunk: usize,
    /// The whole of `S` (row-major `f64`) when the forward pass ran as a single chunk.
    cached: Option<Arc<Vec<f64>>>,
}

impl<R: RowLoss> RowLossOp<R> {
    /// `upstream · ∂loss/∂S[start..start+len, ·]` as a `len × B` tensor on the embeddings'
    /// device, from the rows `sims` of `S`.
    fn grad_rows(
        &self,
        e: &Tensor,
        sims: &[f64],
        start: usize,
        len: usize,
        upstream: f64,
    ) -> Result<Tensor> {
        let (b, _) = e.dims2()?;
        let mut grads = vec![0.0f64; len * b];
        grads
            .par_chunks_mut(b)
            .zip(sims.par_chunks(b))
            .enumerate()
            .for_each(|(i, (out, row))| {
                let q = start + i;
                self.loss
                    .row_grad(q, row, &self.rows[q], &self.global, upstream, out);
            });
        Ok(Tensor::from_vec(grads, (len, b), &Device::Cpu)?
            .to_dtype(e.dtype())?
            .to_device(e.device())?)
    }

    /// `∂loss/∂Ê = G Ê + Gᵀ Ê` with `G = upstream · ∂loss/∂S`, since `S = Ê Êᵀ` makes row `q` of
    /// `S` depend on `ê_q` (through `G Ê`) and on every `ê_j` (through `Gᵀ Ê`).
    fn gradient(&self, e: &Tensor, upstream: f64) -> Result<Tensor> {
        let (b, _) = e.dims2()?;
        if let Some(sims) = &self.cached {
            // One chunk: a single product with G + Gᵀ.
            let g = self.grad_rows(e, sims, 0, b, upstream)?;
            return Ok((&g + g.t()?)?.matmul(e)?);
        }
        let mut row_parts = Vec::new();
        let mut col_sum: Option<Tensor> = None;
        for start in (0..b).step_by(self.chunk) {
            let len = self.chunk.min(b - start);
            let sims = chunk_similarities(e, start, len)?;
            let g = self.grad_rows(e, &sims, start, len, upstream)?;
            let eq = e.narrow(0, start, len)?;
            row_parts.push(g.matmul(e)?);
            let col = g.t()?.matmul(&eq)?;
            col_sum = Some(match col_sum {
                None => col,
                Some(acc) => (acc + col)?,
            });
        }
        let rows = Tensor::cat(&row_parts, 0)?;
        Ok(match col_sum {
            Some(c) => (rows + c)?,
            None => rows,
        })
    }
}

impl<R: RowLoss> CustomOp2 for RowLossOp<R> {
    fn name(&self) -> &'static str {
        "rankwise-row-loss"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        value: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((value.try_clone(layout)?, layout.shape().clone()))
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        value: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        Ok((value.try_clone(layout)?, layout.shape().clone()))
    }

    fn metal_fwd(
        &self,
        _: &MetalStorage,
        _: &Layout,
        value: &MetalStorage,
        layout: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        Ok((value.try_clone(layout)?, layout.shape().clone()))
    }

    fn bwd(
        &self,
        embeddings: &Tensor,
        _value: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let upstream = grad_res
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?
            .first()
            .copied()
            .unwrap_or(0.0);
        let grad = self
            .gradient(&embeddings.detach(), upstream)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((Some(grad), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// A toy row loss: Σ_q Σ_{j≠q} w_j · S[q, j]² / B, with fixed column weights.
    struct Quadratic {
        weights: Vec<f64>,
    }

    impl RowLoss for Quadratic {
        type Row = f64;
        /// (B, loss value)
        type Global = (usize, f64);
        fn summarise(&self, q: usize, sims: &[f64]) -> f64 {
            sims.iter()
                .enumerate()
                .filter(|(j, _)| *j != q)
                .map(|(j, s)| self.weights[j] * s * s)
                .sum()
        }
        fn global(&self, rows: &[f64]) -> Result<(usize, f64)> {
            Ok((rows.len(), rows.iter().sum::<f64>() / rows.len() as f64))
        }
        fn value(&self, g: &(usize, f64)) -> f64 {
            g.1
        }
        fn row_grad(
            &self,
            q: usize,
            sims: &[f64],
            _: &f64,
            g: &(usize, f64),
            up: f64,
            out: &mut [f64],
        ) {
            for (j, s) in sims.iter().enumerate() {
                if j != q {
                    out[j] = up * 2.0 * self.weights[j] * s / g.0 as f64;
                }
            }
        }
    }

    #[test]
    fn metric_slopes() {
        assert_eq!(PairMetric::Cosine.distance(0.25), -0.25);
        assert_eq!(PairMetric::Euclidean.distance(0.5), 1.0);
        assert_eq!(PairMetric::Euclidean.distance_slope(0.0), 0.0);
        assert_eq!(PairMetric::Euclidean.distance_slope(2.0), -0.5);
    }

    #[test]
    fn chunk_validation() {
        assert!(chunk_size(Some(0), 4).is_err());
        assert_eq!(chunk_size(Some(10), 4).unwrap(), 4);
        assert_eq!(chunk_size(None, 4).unwrap(), 4);
    }

    #[test]
    fn engine_gradient_matches_autograd_for_every_chunk() {
        let data: Vec<f64> = (0..15).map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0).collect();
        let weights = vec![0.5, -1.0, 2.0, 0.25, 1.5];
        // Autograd reference on the full matrix.
        let v = Var::from_vec(data.clone(), (5, 3), &Device::Cpu).unwrap();
        let s = v.matmul(&v.t().unwrap()).unwrap();
        let mut mask = vec![0.0f64; 25];
        for q in 0..5 {
            for j in 0..5 {
                if q != j {
                    mask[q * 5 + j] = weights[j] / 5.0;
                }
            }
        }
        let m = Tensor::from_vec(mask, (5, 5), &Device::Cpu).unwrap();
        let reference = (s.sqr().unwrap() * m).unwrap().sum_all().unwrap();
        let want = reference.backward().unwrap();
        let want = want
            .get(&v)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        for chunk in [1, 2, 3, 5] {
            let v = Var::from_vec(data.clone(), (5, 3), &Device::Cpu).unwrap();
            let loss = Quadratic {
                weights: weights.clone(),
            };
            let (out, _) = row_loss(v.as_tensor(), loss, chunk).unwrap();
            let value = out.to_scalar::<f64>().unwrap();
            assert!((value - reference.to_scalar::<f64>().unwrap()).abs() < 1e-12);
            let scaled = (out * 3.0).unwrap();
            let got = scaled.backward().unwrap();
            let got = got
                .get(&v)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - 3.0 * w).abs() < 1e-12,
                    "chunk {chunk}: {g} vs {}",
                    3.0 * w
                );
            }
        }
    }

    #[test]
    fn normalisation_rejects_zero_rows() {
        let e = Tensor::new(&[[3f64, 4.0], [0.0, 0.0]], &Device::Cpu).unwrap();
        let err = crate::losses::l2_normalize(&e, "embeddings")
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 1"), "{err}");
        let e = Tensor::new(&[[3f64, 4.0]], &Device::Cpu).unwrap();
        let n = crate::losses::l2_normalize(&e, "embeddings")
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        assert_eq!(n, vec![vec![0.6, 0.8]]);
        assert!(check_unit_rows(&e, 1e-6).is_err());
    }
}

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
//! The value is attached to the autograd graph by `crate::attach::attach`, whose forward is a
//! copy of the precomputed value, so the op runs on every candle device: the similarity products use the
//! device of the embeddings and only the `chunk × B` rows travel to the CPU for the per-row
//! logic (in `f64`, in parallel over rows with rayon).
//!
//! On the CPU with the batch in one chunk (the default) both passes take the path of `fused`:
//! the same arithmetic, each pass handed to the thread pool once instead of once per step.

use crate::cpu::host_sums::{dot, host_f64, sum_squares, vectorised, with_host_values, HostValues};
use crate::cpu::work_phases::Slot;
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use candle_core::{DType, Device, Tensor, WithDType};
use rayon::prelude::*;
use std::sync::Arc;

mod fused;

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

    /// [`PairMetric::distance`] of every entry of a `B × B` similarity matrix, as a tensor (the
    /// plain formulations' `x`). The Euclidean root gets 1 added on the diagonal, which those
    /// formulations never use, so that its gradient stays finite there.
    pub fn distance_matrix(self, s: &Tensor) -> Result<Tensor> {
        Ok(match self {
            PairMetric::Cosine => s.neg()?,
            PairMetric::Euclidean => {
                let eye = Tensor::eye(s.dim(0)?, s.dtype(), s.device())?;
                (s.affine(-2.0, 2.0)?.relu()? + eye)?.sqrt()?
            }
        })
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

/// What the engine receives: raw embeddings it L2-normalises itself (and differentiates
/// through), or rows that are already unit vectors (FastAP's `normalize = false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    /// `êᵢ = xᵢ/‖xᵢ‖` inside the engine; the backward pass applies
    /// `∂loss/∂xᵢ = (gᵢ − êᵢ(êᵢ·gᵢ))/‖xᵢ‖` to `gᵢ = ∂loss/∂êᵢ`.
    Normalise,
    /// The rows are used as given.
    AsGiven,
}

/// The unit rows `Ê` the engine works on.
///
/// Why the engine normalises itself instead of receiving `l2_normalize(x)` from candle: on the
/// CPU the normalisation, its backward pass and the `B × B` products are then a handful of
/// passes over plain slices instead of about fifteen candle element-wise ops, each allocating
/// and synchronising the thread pool; at B = 256 those ops cost as much as the two products.
struct UnitRows {
    /// `Ê` on the embeddings' device and dtype (operand of the products).
    tensor: Tensor,
    /// `‖xᵢ‖` per row when the engine normalised (`None`: [`Input::AsGiven`]).
    norms: Option<Vec<f64>>,
    /// Whether the backward pass runs on the host (CPU slices) rather than as tensor ops.
    on_host: bool,
    /// `Ê` as row-major `f64` on the host path when `tensor` cannot be read in place (a dtype
    /// other than `f32`/`f64`); otherwise the host path reads `tensor`'s own storage (exact:
    /// the values the products see, and half the bytes for `f32`).
    copy: Option<Vec<f64>>,
}

/// Below this many values a conversion runs on the calling thread.
const PARALLEL_MIN_LEN: usize = 1 << 16;

/// A tensor of `dtype` on `device` from row-major `f64` values. `f32` and `f64` are converted
/// here on the host rather than by a candle cast: candle runs element-wise ops of 64 Ki elements
/// or more on its own thread pool, whose workers then spin for a while and, on a 2-core
/// machine, take a core from the rayon threads that run the loss's next step.
fn tensor_from_f64(
    values: Vec<f64>,
    shape: (usize, usize),
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let t = match dtype {
        DType::F64 => Tensor::from_vec(values, shape, &Device::Cpu)?,
        DType::F32 => {
            // Small vectors (the loss value itself) on the calling thread: a rayon call costs
            // a round trip to the pool's threads, tens of µs when they have gone to sleep.
            let v: Vec<f32> = if values.len() < PARALLEL_MIN_LEN {
                values.iter().map(|&x| x as f32).collect()
            } else {
                values.par_iter().map(|&x| x as f32).collect()
            };
            Tensor::from_vec(v, shape, &Device::Cpu)?
        }
        _ => Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)?,
    };
    Ok(t.to_device(device)?)
}

/// Errors on a row whose norm cannot divide (the check of [`crate::losses::l2_normalize`]).
fn check_norms(norms: &[f64]) -> Result<()> {
    crate::losses::guard::norms_error(norms, "embeddings").map_or(Ok(()), Err)
}

/// `êᵢ = xᵢ/‖xᵢ‖` of the row-major `b × d` values `x` in one pass over the rows: `Ê` as a CPU
/// tensor of `x`'s type, and the norms (computed in `f64`, so large `f32` values do not
/// overflow). A zero or non-finite norm yields non-finite values; the caller checks the norms.
fn normalise_rows<T: WithDType + Into<f64>>(
    x: &[T],
    b: usize,
    d: usize,
) -> Result<(Tensor, Vec<f64>)> {
    let d1 = d.max(1);
    let mut unit = vec![T::from_f64(0.0); b * d];
    let mut norms = vec![0.0f64; b];
    unit.par_chunks_mut(d1)
        .zip(x.par_chunks(d1))
        .zip(norms.par_iter_mut())
        .for_each(|((u, row), n)| {
            vectorised(
                #[inline(always)]
                || *n = normalise_row(row, u),
            )
        });
    Ok((Tensor::from_vec(unit, (b, d), &Device::Cpu)?, norms))
}

/// Writes `row/‖row‖` into `u` and returns `‖row‖` (in `f64`). Inlined so that it runs on the
/// SIMD level of the caller's [`vectorised`] block.
#[inline(always)]
fn normalise_row<T: WithDType + Into<f64>, O: Slot<T>>(row: &[T], u: &mut [O]) -> f64 {
    let n = sum_squares(row).sqrt();
    let inv = 1.0 / n;
    for (u, &v) in u.iter_mut().zip(row) {
        u.set(T::from_f64(v.into() * inv));
    }
    n
}

/// Row `i` of `∂loss/∂x` from row `g` of `∂loss/∂Ê`: `(g − êᵢ(êᵢ·g))/‖xᵢ‖` when the engine
/// normalised (`norm = Some(‖xᵢ‖)`, `e = êᵢ`), else `g`; computed in `f64` and rounded once into
/// `o`. Inlined for the caller's [`vectorised`] block.
#[inline(always)]
fn finish_row<U: Copy + Into<f64>, T: WithDType, O: Slot<T>>(
    g: &[f64],
    e: &[U],
    norm: Option<f64>,
    o: &mut [O],
) {
    let Some(norm) = norm else {
        o.iter_mut()
            .zip(g.iter())
            .for_each(|(o, &v)| o.set(T::from_f64(v)));
        return;
    };
    let dot = dot(g, e);
    let inv = 1.0 / norm;
    for ((o, &g), &e) in o.iter_mut().zip(g.iter()).zip(e) {
        o.set(T::from_f64((g - e.into() * dot) * inv));
    }
}

/// The rows of `∂loss/∂Ê` on the host, one at a time (so that the normalisation's backward
/// pass runs on each row while it is in cache, straight after the row is formed).
trait GradRows: Sync {
    /// Adds row `i` of `∂loss/∂Ê` to `out` (length `D`, zeroed).
    fn add_row(&self, i: usize, out: &mut [f64]);
}

/// `∂loss/∂Ê` held densely (row-major `f32` or `f64`), e.g. the result of the dense product.
struct DenseRows<'a, G> {
    g: &'a [G],
    d: usize,
}

impl<G: Copy + Into<f64> + Sync> GradRows for DenseRows<'_, G> {
    #[inline(always)]
    fn add_row(&self, i: usize, out: &mut [f64]) {
        let row = &self.g[i * self.d..(i + 1) * self.d];
        out.iter_mut().zip(row).for_each(|(o, &v)| *o += v.into());
    }
}

/// `(G + Gᵀ) Ê` from the non-zero entries of `G = upstream · ∂loss/∂S` (exact: the same sums,
/// in `f64`): by row (`rows[i]`: `(j, G_ij)`) and by column (`columns[i]`: `(j, G_ji)`, see
/// [`columns_of`]), so that row `i` is `Σ_{(j, w) ∈ rows[i] ∪ columns[i]} w · ê_j`.
struct SparseRows<'a, U> {
    rows: &'a [Vec<(usize, f64)>],
    columns: &'a [Vec<(usize, f64)>],
    unit: &'a [U],
    d: usize,
}

impl<U: Copy + Into<f64> + Sync> GradRows for SparseRows<'_, U> {
    /// Row `i` of `(G + Gᵀ) Ê`: `rows[i]` and `columns[i]` are both sorted by `j`, so they are
    /// merged on the fly and a `j` present in both (every pair of a symmetric loss such as the
    /// contrastive one) costs one pass over `ê_j` with weight `G_ij + G_ji`, as in the dense
    /// product's `G + Gᵀ`.
    #[inline(always)]
    fn add_row(&self, i: usize, out: &mut [f64]) {
        let (row, column) = (&self.rows[i], &self.columns[i]);
        let (mut a, mut c) = (0, 0);
        loop {
            let (j, w) = match (row.get(a), column.get(c)) {
                (Some(&(ja, wa)), Some(&(jc, wc))) if ja == jc => {
                    a += 1;
                    c += 1;
                    (ja, wa + wc)
                }
                (Some(&(ja, wa)), Some(&(jc, _))) if ja < jc => {
                    a += 1;
                    (ja, wa)
                }
                (Some(&(ja, wa)), None) => {
                    a += 1;
                    (ja, wa)
                }
                (_, Some(&(jc, wc))) => {
                    c += 1;
                    (jc, wc)
                }
                (None, None) => break,
            };
            let ej = &self.unit[j * self.d..(j + 1) * self.d];
            out.iter_mut()
                .zip(ej)
                .for_each(|(o, &v)| *o += w * v.into());
        }
    }
}

/// What the input gradient is made for: the norms of the engine's normalisation (`None`:
/// [`Input::AsGiven`]) and the input's shape, dtype and device.
#[derive(Clone, Copy)]
struct InputGrad<'a> {
    norms: Option<&'a [f64]>,
    shape: (usize, usize),
    dtype: DType,
    device: &'a Device,
}

/// `∂loss/∂x` as a tensor of `dtype` on `device`, row by row from `∂loss/∂Ê`: row `i` is
/// `(gᵢ − êᵢ(êᵢ·gᵢ))/‖xᵢ‖` when the engine normalised (`norms`), else `gᵢ`; in `f64`, rounded
/// once to `dtype`.
fn input_gradient<S: GradRows, U: Copy + Into<f64> + Sync>(
    src: &S,
    unit: &[U],
    to: InputGrad<'_>,
) -> Result<Tensor> {
    let InputGrad {
        norms,
        shape,
        dtype,
        device,
    } = to;
    fn rows<S: GradRows, U: Copy + Into<f64> + Sync, T: WithDType>(
        src: &S,
        unit: &[U],
        norms: Option<&[f64]>,
        (b, d): (usize, usize),
    ) -> Vec<T> {
        let mut out = vec![T::from_f64(0.0); b * d];
        out.par_chunks_mut(d.max(1)).enumerate().for_each_init(
            || vec![0.0f64; d],
            |g, (i, o)| {
                vectorised(
                    #[inline(always)]
                    || {
                        g.fill(0.0);
                        src.add_row(i, g);
                        let e = &unit[i * d..(i + 1) * d];
                        finish_row(g, e, norms.map(|n| n[i]), o);
                    },
                )
            },
        );
        out
    }
    let t = match dtype {
        DType::F32 => Tensor::from_vec(
            rows::<S, U, f32>(src, unit, norms, shape),
            shape,
            &Device::Cpu,
        )?,
        DType::F64 => Tensor::from_vec(
            rows::<S, U, f64>(src, unit, norms, shape),
            shape,
            &Device::Cpu,
        )?,
        _ => {
            return tensor_from_f64(
                rows::<S, U, f64>(src, unit, norms, shape),
                shape,
                dtype,
                device,
            )
        }
    };
    Ok(t.to_device(device)?)
}

impl UnitRows {
    /// `Ê` from the (detached) embeddings. `on_host` selects the CPU path (plain slices); the
    /// tensor path is what other devices run, and is tested on the CPU against the host path.
    fn new(x: &Tensor, input: Input, on_host: bool) -> Result<Self> {
        let (b, d) = x.dims2()?;
        if !on_host {
            return Ok(match input {
                Input::AsGiven => UnitRows {
                    tensor: x.clone(),
                    norms: None,
                    on_host,
                    copy: None,
                },
                Input::Normalise => {
                    let norms_t = x.sqr()?.sum_keepdim(1)?.sqrt()?;
                    let norms = norms_t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
                    check_norms(&norms)?;
                    UnitRows {
                        tensor: x.broadcast_div(&norms_t)?,
                        norms: Some(norms),
                        on_host,
                        copy: None,
                    }
                }
            });
        }
        if input == Input::AsGiven {
            let readable = with_host_values(x, |_| ()).is_some();
            return Ok(UnitRows {
                tensor: x.clone(),
                norms: None,
                on_host,
                copy: if readable { None } else { Some(host_f64(x)?) },
            });
        }
        let normalised = with_host_values(x, |v| match v {
            HostValues::F32(s) => normalise_rows(s, b, d),
            HostValues::F64(s) => normalise_rows(s, b, d),
        });
        let (tensor, norms, copy) = match normalised {
            Some(r) => {
                let (t, norms) = r?;
                (t, norms, None)
            }
            None => {
                // Other dtypes (or a strided view): normalise an f64 copy, then round Ê to the
                // embeddings' dtype and keep those values, exactly what the products see.
                let (t, norms) = normalise_rows(&host_f64(x)?, b, d)?;
                let t = t.to_dtype(x.dtype())?;
                let copy = host_f64(&t)?;
                (t, norms, Some(copy))
            }
        };
        check_norms(&norms)?;
        Ok(UnitRows {
            tensor,
            norms: Some(norms),
            on_host,
            copy,
        })
    }

    /// `∂loss/∂x` from `∂loss/∂Ê` (the normalisation's backward pass; identity for
    /// [`Input::AsGiven`]).
    fn backward(&self, grad: Tensor, dtype: DType, device: &Device) -> Result<Tensor> {
        let (b, d) = self.tensor.dims2()?;
        let norms = self.norms.as_deref();
        let to = InputGrad {
            norms,
            shape: (b, d),
            dtype,
            device,
        };
        match grad {
            t if norms.is_none() => Ok(t),
            g if !self.on_host => {
                let norms = norms.unwrap_or_default();
                let e = &self.tensor;
                let norms_t = Tensor::from_slice(norms, (b, 1), device)?.to_dtype(dtype)?;
                let dot = (&g * e)?.sum_keepdim(1)?;
                Ok((g - e.broadcast_mul(&dot)?)?.broadcast_div(&norms_t)?)
            }
            t => self.with_unit(|unit| match unit {
                HostValues::F32(u) => dense_input_gradient(&t, u, to),
                HostValues::F64(u) => dense_input_gradient(&t, u, to),
            }),
        }
    }

    /// Runs `f` on `Ê`'s values on the host path: the kept `f64` copy, or `tensor`'s own storage.
    fn with_unit(&self, f: impl FnOnce(HostValues<'_>) -> Result<Tensor>) -> Result<Tensor> {
        if let Some(copy) = &self.copy {
            return f(HostValues::F64(copy));
        }
        with_host_values(&self.tensor, f).unwrap_or_else(|| {
            Err(Error::invalid(
                "embeddings",
                "internal: the host path needs the unit rows in CPU memory",
            ))
        })
    }
}

/// [`input_gradient`] from the dense product's result `t`, read where it lies when it is a
/// contiguous `f32`/`f64` CPU tensor (no `f64` copy).
fn dense_input_gradient<U: Copy + Into<f64> + Sync>(
    t: &Tensor,
    unit: &[U],
    to: InputGrad<'_>,
) -> Result<Tensor> {
    let d = to.shape.1;
    let borrowed = with_host_values(t, |v| match v {
        HostValues::F32(g) => input_gradient(&DenseRows { g, d }, unit, to),
        HostValues::F64(g) => input_gradient(&DenseRows { g, d }, unit, to),
    });
    match borrowed {
        Some(r) => r,
        None => input_gradient(
            &DenseRows {
                g: &host_f64(t)?,
                d,
            },
            unit,
            to,
        ),
    }
}

/// The non-zero entries `(j, row[j])` of `row` in column order, or `None` as soon as there are
/// more than `cap` of them.
fn nonzeros_up_to(row: &[f64], cap: usize) -> Option<Vec<(usize, f64)>> {
    // Blocks of 8 are tested at once (a branch-free test that vectorises) and only blocks with
    // a non-zero are walked: the rows of a sparse G are nearly all zeros.
    const BLOCK: usize = 8;
    let mut list = Vec::new();
    for (b, block) in row.chunks(BLOCK).enumerate() {
        if block.iter().fold(true, |zero, &w| zero & (w == 0.0)) {
            continue;
        }
        for (k, &w) in block.iter().enumerate() {
            if w != 0.0 {
                if list.len() == cap {
                    return None;
                }
                list.push((b * BLOCK + k, w));
            }
        }
    }
    Some(list)
}

/// The column lists of a sparse `G` from its row lists (`rows[i]`: `(j, G_ij)`, sorted by
/// `j`): `columns[j]` holds `(i, G_ij)`, gathered in row order, so sorted by `i` too.
fn columns_of(rows: &[Vec<(usize, f64)>], b: usize) -> Vec<Vec<(usize, f64)>> {
    let mut columns: Vec<Vec<(usize, f64)>> = vec![Vec::new(); b];
    for (i, list) in rows.iter().enumerate() {
        for &(j, w) in list {
            columns[j].push((i, w));
        }
    }
    columns
}

/// Computes a [`RowLoss`] over the embeddings (`B × D`, part of the autograd graph; normalised
/// by the engine under [`Input::Normalise`]) in chunks of `chunk` query rows. Returns the scalar
/// loss (dtype and device of the embeddings) and the row summaries of the value pass.
pub(crate) fn row_loss<R: RowLoss>(
    embeddings: &Tensor,
    input: Input,
    loss: R,
    chunk: usize,
) -> Result<(Tensor, Arc<Vec<R::Row>>)> {
    let on_host = embeddings.device().is_cpu();
    row_loss_on(embeddings, input, loss, chunk, on_host)
}

/// [`row_loss`] with the host (CPU slices) or tensor path chosen explicitly.
fn row_loss_on<R: RowLoss>(
    embeddings: &Tensor,
    input: Input,
    loss: R,
    chunk: usize,
    on_host: bool,
) -> Result<(Tensor, Arc<Vec<R::Row>>)> {
    let x = embeddings.detach();
    let (b, _) = x.dims2()?;
    let loss = Arc::new(loss);
    if on_host && chunk >= b {
        if let Some(f) = fused::forward(&x, input, loss.as_ref())? {
            return attach(
                embeddings,
                loss,
                f.unit,
                f.rows,
                chunk,
                Some(Arc::new(f.sims)),
            );
        }
    }
    let unit = UnitRows::new(&x, input, on_host)?;
    let e = &unit.tensor;
    let mut rows: Vec<R::Row> = Vec::with_capacity(b);
    let mut cached = None;
    for start in (0..b).step_by(chunk) {
        let len = chunk.min(b - start);
        let sims = chunk_similarities(e, start, len)?;
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
    attach(embeddings, loss, unit, rows, chunk, cached)
}

/// The loss value from the row summaries, attached to the autograd graph of `embeddings` by a
/// [`RowLossOp`] that keeps what the backward pass needs.
fn attach<R: RowLoss>(
    embeddings: &Tensor,
    loss: Arc<R>,
    unit: UnitRows,
    rows: Vec<R::Row>,
    chunk: usize,
    cached: Option<Arc<Vec<f64>>>,
) -> Result<(Tensor, Arc<Vec<R::Row>>)> {
    let e = &unit.tensor;
    let rows = Arc::new(rows);
    let global = Arc::new(loss.global(&rows)?);
    let value = loss.value(&global);
    let value = tensor_from_f64(vec![value], (1, 1), e.dtype(), e.device())?
        .squeeze(0)?
        .squeeze(0)?;
    let op = RowLossOp {
        loss,
        rows: rows.clone(),
        global,
        chunk,
        cached,
        unit,
    };
    let out = crate::attach::attach(embeddings, &value, move |embeddings, _value, grad| {
        let upstream = grad
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?
            .first()
            .copied()
            .unwrap_or(0.0);
        op.gradient(&embeddings.detach(), upstream)
            .map(Some)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))
    })?;
    Ok((out, rows))
}

/// `S[start..start+len, ·]` as row-major `f64` (the product runs on the embeddings' device and
/// dtype, like the authors' `x @ x.T`).
fn chunk_similarities(e: &Tensor, start: usize, len: usize) -> Result<Vec<f64>> {
    let eq = e.narrow(0, start, len)?;
    host_f64(&eq.matmul(&e.t()?)?)
}

/// `G + Gᵀ` of a row-major `b × b` matrix, in tiles so that both reads stay in cache.
fn symmetrise(g: &[f64], b: usize) -> Vec<f64> {
    const TILE: usize = 64;
    let mut out = vec![0.0f64; b * b];
    out.par_chunks_mut(TILE * b)
        .enumerate()
        .for_each(|(block, rows)| {
            let i0 = block * TILE;
            for j0 in (0..b).step_by(TILE) {
                for (di, row) in rows.chunks_mut(b).enumerate() {
                    let i = i0 + di;
                    for j in j0..(j0 + TILE).min(b) {
                        row[j] = g[i * b + j] + g[j * b + i];
                    }
                }
            }
        });
    out
}

/// The largest share of non-zero entries of `G + Gᵀ` for which the backward product runs as a
/// sparse sum of rows instead of a dense product. The sparse sum does one `f64` multiply-add per
/// non-zero and dimension; the dense `f32` product does `B·D` per row at several times that rate
/// (wider SIMD lanes, cache blocking), so the sparse sum only pays off well below full density.
/// 1/8 is a conservative bound from that ratio, not a measured crossover. What was measured
/// (B = 256, D = 512, 2 cores): the contrastive loss (≈ 1% non-zero on random embeddings) gains
/// the time of one product; FastAP (every pair non-zero) keeps the dense product.
/// See benches/losses_vs_torch.md.
const SPARSE_BACKWARD_DENSITY: f64 = 0.125;

/// What the backward pass of a [`RowLoss`] value needs (the value is attached to the graph by
/// [`crate::attach::attach`]); the backward pass recomputes the chunks.
struct RowLossOp<R: RowLoss> {
    loss: Arc<R>,
    rows: Arc<Vec<R::Row>>,
    global: Arc<R::Global>,
    chunk: usize,
    /// The whole of `S` (row-major `f64`) when the forward pass ran as a single chunk.
    cached: Option<Arc<Vec<f64>>>,
    /// `Ê` and what the backward pass needs of the normalisation.
    unit: UnitRows,
}

impl<R: RowLoss> RowLossOp<R> {
    /// `upstream · ∂loss/∂S[start..start+len, ·]` as row-major `f64` (`len × B`), from the rows
    /// `sims` of `S`.
    fn grad_rows(
        &self,
        b: usize,
        sims: &[f64],
        start: usize,
        len: usize,
        upstream: f64,
    ) -> Vec<f64> {
        let mut grads = vec![0.0f64; len * b];
        grads
            .par_chunks_mut(b)
            .zip(sims.par_chunks(b))
            .enumerate()
            .for_each(|(i, (out, row))| self.row_grad(start + i, row, upstream, out));
        grads
    }

    /// Writes `upstream · ∂loss/∂S[q, ·]` into `out` (zeroed) from the row `S[q, ·]`, with the
    /// summaries kept by the forward pass.
    fn row_grad(&self, q: usize, row: &[f64], upstream: f64, out: &mut [f64]) {
        self.loss
            .row_grad(q, row, &self.rows[q], &self.global, upstream, out);
    }

    /// `∂loss/∂Ê = G Ê + Gᵀ Ê` with `G = upstream · ∂loss/∂S`, since `S = Ê Êᵀ` makes row `q` of
    /// `S` depend on `ê_q` (through `G Ê`) and on every `ê_j` (through `Gᵀ Ê`).
    fn unit_gradient(&self, upstream: f64) -> Result<Tensor> {
        let e = &self.unit.tensor;
        let (b, _) = e.dims2()?;
        let to_tensor = |rows: Vec<f64>, len: usize| -> Result<Tensor> {
            tensor_from_f64(rows, (len, b), e.dtype(), e.device())
        };
        if let Some(sims) = &self.cached {
            // One chunk: a single product with G + Gᵀ.
            let g = self.grad_rows(b, sims, 0, b, upstream);
            let sym = symmetrise(&g, b);
            drop(g); // at B = 4096 each of these is 128 MiB
            return Ok(to_tensor(sym, b)?.matmul(e)?);
        }
        let mut row_parts = Vec::new();
        let mut col_sum: Option<Tensor> = None;
        for start in (0..b).step_by(self.chunk) {
            let len = self.chunk.min(b - start);
            let sims = chunk_similarities(e, start, len)?;
            let g = to_tensor(self.grad_rows(b, &sims, start, len, upstream), len)?;
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

    /// `∂loss/∂x` for the op's input.
    fn gradient(&self, input: &Tensor, upstream: f64) -> Result<Tensor> {
        if let Some(sims) = &self.cached {
            if let Some(g) = fused::backward(self, sims, upstream)? {
                return Ok(g);
            }
        }
        let grad = self.unit_gradient(upstream)?;
        self.unit.backward(grad, input.dtype(), input.device())
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

    /// The gradient of `out` with respect to `v`, flattened.
    /// (f32 and f16 gradients are widened to f64 exactly.)
    fn grad_of(out: &Tensor, v: &Var) -> Vec<f64> {
        let grads = out.backward().unwrap();
        grads
            .get(v)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Autograd reference of the Quadratic loss on the `b` rows of `data` (normalised first by
    /// `l2_normalize` under [`Input::Normalise`]): value and gradient.
    fn autograd_reference(
        data: &[f64],
        weights: &[f64],
        b: usize,
        input: Input,
    ) -> (f64, Vec<f64>) {
        let d = data.len() / b;
        let v = Var::from_vec(data.to_vec(), (b, d), &Device::Cpu).unwrap();
        let e = match input {
            Input::Normalise => crate::losses::l2_normalize(v.as_tensor(), "embeddings").unwrap(),
            Input::AsGiven => v.as_tensor().clone(),
        };
        let s = e.matmul(&e.t().unwrap()).unwrap();
        let mut mask = vec![0.0f64; b * b];
        for q in 0..b {
            for j in 0..b {
                if q != j {
                    mask[q * b + j] = weights[j] / b as f64;
                }
            }
        }
        let m = Tensor::from_vec(mask, (b, b), &Device::Cpu).unwrap();
        let value = (s.sqr().unwrap() * m).unwrap().sum_all().unwrap();
        (value.to_scalar::<f64>().unwrap(), grad_of(&value, &v))
    }

    /// The engine's value of the Quadratic loss and the gradient of `upstream × value`.
    fn engine(
        data: &[f64],
        weights: &[f64],
        b: usize,
        (input, chunk, host): (Input, usize, bool),
        upstream: f64,
    ) -> (f64, Vec<f64>) {
        let d = data.len() / b;
        let v = Var::from_vec(data.to_vec(), (b, d), &Device::Cpu).unwrap();
        let loss = Quadratic {
            weights: weights.to_vec(),
        };
        let (out, _) = row_loss_on(v.as_tensor(), input, loss, chunk, host).unwrap();
        let scaled = (&out * upstream).unwrap();
        (out.to_scalar::<f64>().unwrap(), grad_of(&scaled, &v))
    }

    #[test]
    fn engine_gradient_matches_autograd_for_every_chunk() {
        let data: Vec<f64> = (0..15).map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0).collect();
        let weights = vec![0.5, -1.0, 2.0, 0.25, 1.5];
        // Autograd reference on the full matrix.
        let (reference, want) = autograd_reference(&data, &weights, 5, Input::AsGiven);
        for chunk in [1, 2, 3, 5] {
            let (value, got) = engine(&data, &weights, 5, (Input::AsGiven, chunk, true), 3.0);
            assert!((value - reference).abs() < 1e-12);
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
    fn normalising_engine_matches_autograd_through_l2_normalize() {
        // Rows of very different norms, so the normalisation's backward pass matters.
        let b = 6;
        let data: Vec<f64> = (0..b * 4)
            .map(|i| ((i * 5 % 13) as f64 - 6.0) * (1.0 + (i / 4) as f64))
            .collect();
        let weights = vec![0.5, -1.0, 2.0, 0.25, 1.5, -0.75];
        let (want_v, want_g) = autograd_reference(&data, &weights, b, Input::Normalise);
        // Host (CPU slices) and tensor (other devices) paths, unchunked and chunked.
        for host in [true, false] {
            for chunk in [1, 4, 6] {
                let (v, g) = engine(&data, &weights, b, (Input::Normalise, chunk, host), 1.0);
                assert!((v - want_v).abs() < 1e-12, "host {host} chunk {chunk}");
                for (a, w) in g.iter().zip(&want_g) {
                    assert!(
                        (a - w).abs() < 1e-12,
                        "host {host} chunk {chunk}: {a} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn sparse_backward_equals_the_dense_product() {
        // Only two columns carry weight, so G + Gᵀ is sparse enough for the host's sparse sum
        // (about 4·B non-zeros of B²: 10 % at B = 40).
        let b = 40;
        let data: Vec<f64> = (0..b * 3)
            .map(|i| ((i * 7 % 17) as f64 - 8.0) / 3.0)
            .collect();
        let mut weights = vec![0.0; b];
        weights[3] = 1.5;
        weights[17] = -0.5;
        let g_nonzero = 2 * (b - 1);
        assert!((2 * g_nonzero) as f64 <= SPARSE_BACKWARD_DENSITY * (b * b) as f64);
        for input in [Input::Normalise, Input::AsGiven] {
            let (want_v, want_g) = autograd_reference(&data, &weights, b, input);
            let (v, g) = engine(&data, &weights, b, (input, b, true), 1.0);
            assert!(
                (v - want_v).abs() < 1e-12 * (1.0 + want_v.abs()),
                "{input:?}"
            );
            for (a, w) in g.iter().zip(&want_g) {
                assert!(
                    (a - w).abs() < 1e-12 * (1.0 + w.abs()),
                    "{input:?}: {a} vs {w}"
                );
            }
        }
        // f32 embeddings: the same gradient, rounded once to f32 at the end.
        let (_, want_g) = autograd_reference(&data, &weights, b, Input::Normalise);
        let narrow: Vec<f32> = data.iter().map(|&x| x as f32).collect();
        let v = Var::from_vec(narrow, (b, 3), &Device::Cpu).unwrap();
        let loss = Quadratic { weights };
        let (out, _) = row_loss_on(v.as_tensor(), Input::Normalise, loss, b, true).unwrap();
        let got = grad_of(&out, &v);
        for (a, w) in got.iter().zip(&want_g) {
            assert!((a - w).abs() < 1e-5 * (1.0 + w.abs()), "f32: {a} vs {w}");
        }
    }

    #[test]
    fn half_precision_embeddings_take_the_host_copy_path() {
        // f16 storage cannot be read in place as f32/f64: the host path keeps an f64 copy of Ê
        // (rounded to f16, as the products see it) and must agree with the tensor path.
        let (b, d) = (6, 4);
        let data: Vec<f64> = (0..b * d)
            .map(|i| ((i * 5 % 13) as f64 - 6.0) / 4.0)
            .collect();
        let weights = vec![0.5, -1.0, 2.0, 0.25, 1.5, 1.0];
        let x = Tensor::from_vec(data, (b, d), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let unit = UnitRows::new(&x, Input::Normalise, true).unwrap();
        assert!(unit.copy.is_some());
        let grad = |host: bool| {
            let v = Var::from_tensor(&x).unwrap();
            let loss = Quadratic {
                weights: weights.clone(),
            };
            let (out, _) = row_loss_on(v.as_tensor(), Input::Normalise, loss, b, host).unwrap();
            let value = out.to_dtype(DType::F64).unwrap().to_scalar::<f64>();
            (value.unwrap(), grad_of(&out, &v))
        };
        let (vh, gh) = grad(true);
        let (vt, gt) = grad(false);
        assert!((vh - vt).abs() < 1e-2 * (1.0 + vt.abs()), "{vh} vs {vt}");
        for (a, w) in gh.iter().zip(&gt) {
            assert!((a - w).abs() < 2e-2 * (1.0 + w.abs()), "{a} vs {w}");
        }
    }

    #[test]
    fn row_non_zeros_stop_at_the_cap() {
        let row = [0.0, 1.5, 0.0, -0.0, -2.0, 0.25];
        assert_eq!(
            nonzeros_up_to(&row, 3),
            Some(vec![(1, 1.5), (4, -2.0), (5, 0.25)])
        );
        assert_eq!(nonzeros_up_to(&row, 2), None);
        assert_eq!(nonzeros_up_to(&[0.0; 4], 0), Some(vec![]));
    }

    #[test]
    fn sparse_rows_merge_row_and_column_entries_of_the_same_item() {
        // G = [[0, 2, 0], [0, 0, 3], [5, 7, 0]] on Ê = rows (1, 10), (100, 1000), (0.5, 0.25):
        // row i of (G + Gᵀ) Ê sums (G_ij + G_ji) ê_j over j.
        let rows = vec![vec![(1, 2.0)], vec![(2, 3.0)], vec![(0, 5.0), (1, 7.0)]];
        let columns = columns_of(&rows, 3);
        assert_eq!(columns[1], vec![(0, 2.0), (2, 7.0)]);
        let unit = [1.0f32, 10.0, 100.0, 1000.0, 0.5, 0.25];
        let src = SparseRows {
            rows: &rows,
            columns: &columns,
            unit: &unit[..],
            d: 2,
        };
        let g = [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [5.0, 7.0, 0.0]];
        for (i, g_row) in g.iter().enumerate() {
            let mut out = [0.0f64; 2];
            src.add_row(i, &mut out);
            let mut want = [0.0f64; 2];
            for (j, g_col) in g.iter().enumerate() {
                let w = g_row[j] + g_col[i];
                for (k, o) in want.iter_mut().enumerate() {
                    *o += w * f64::from(unit[j * 2 + k]);
                }
            }
            assert_eq!(out, want, "row {i}");
        }
    }

    #[test]
    fn symmetrise_adds_the_transpose_across_tiles() {
        let b = 70; // more than one 64-wide tile
        let g: Vec<f64> = (0..b * b).map(|i| (i % 23) as f64 - 11.0).collect();
        let s = symmetrise(&g, b);
        for i in 0..b {
            for j in 0..b {
                assert_eq!(s[i * b + j], g[i * b + j] + g[j * b + i]);
            }
        }
    }

    #[test]
    fn one_hand_off_path_agrees_with_the_tensor_path_on_any_thread_count() {
        // B = 70 is not a multiple of the chunk height, so the last chunk is short; dense
        // weights take the dense backward, two non-zero columns the sparse one.
        let b = 70;
        let data: Vec<f64> = (0..b * 5)
            .map(|i| ((i * 11 % 23) as f64 - 11.0) * (1.0 + (i % 3) as f64))
            .collect();
        let dense: Vec<f64> = (0..b).map(|j| (j % 7) as f64 / 3.0 - 1.0).collect();
        let mut sparse = vec![0.0; b];
        sparse[5] = 2.0;
        sparse[60] = -1.0;
        for weights in [dense, sparse] {
            for input in [Input::Normalise, Input::AsGiven] {
                let (want_v, want_g) = engine(&data, &weights, b, (input, b, false), 1.0);
                for threads in [1, 2, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let (v, g) = pool.install(|| engine(&data, &weights, b, (input, b, true), 1.0));
                    assert!((v - want_v).abs() < 1e-12 * (1.0 + want_v.abs()));
                    for (a, w) in g.iter().zip(&want_g) {
                        assert!(
                            (a - w).abs() < 1e-12 * (1.0 + w.abs()),
                            "{input:?}, {threads} threads: {a} vs {w}"
                        );
                    }
                }
            }
        }
        // f32: both paths round the same products once; they agree to f32 precision.
        let narrow: Vec<f32> = data.iter().map(|&x| x as f32).collect();
        let grad = |host: bool| {
            let v = Var::from_vec(narrow.clone(), (b, 5), &Device::Cpu).unwrap();
            let loss = Quadratic {
                weights: (0..b).map(|j| (j % 5) as f64 - 2.0).collect(),
            };
            let (out, _) = row_loss_on(v.as_tensor(), Input::Normalise, loss, b, host).unwrap();
            let value = out.to_dtype(DType::F64).unwrap().to_scalar::<f64>();
            (value.unwrap(), grad_of(&out, &v))
        };
        let ((vh, gh), (vt, gt)) = (grad(true), grad(false));
        assert!((vh - vt).abs() < 1e-5 * (1.0 + vt.abs()), "{vh} vs {vt}");
        for (a, w) in gh.iter().zip(&gt) {
            assert!((a - w).abs() < 1e-5 * (1.0 + w.abs()), "f32: {a} vs {w}");
        }
    }

    #[test]
    fn one_hand_off_path_rejects_zero_rows() {
        let x = Tensor::new(&[[3f32, 4.0], [1.0, 0.0], [0.0, 0.0]], &Device::Cpu).unwrap();
        let loss = Quadratic {
            weights: vec![1.0; 3],
        };
        let err = row_loss_on(&x, Input::Normalise, loss, 3, true)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("row 2") && err.contains("zero norm"), "{err}");
    }

    #[test]
    fn engine_rejects_zero_rows_on_both_paths() {
        let e = Tensor::new(&[[3f64, 4.0], [0.0, 0.0]], &Device::Cpu).unwrap();
        for host in [true, false] {
            let err = UnitRows::new(&e, Input::Normalise, host)
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("row 1") && err.contains("zero norm"), "{err}");
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

//! The engine's CPU path for a batch taken in one chunk (`query_chunk` unset, the default),
//! with each pass run as one [`run_phases`] call instead of a rayon loop per step plus the
//! product's own split.
//!
//! Why: a parallel loop started from outside the pool pays a hand-off to threads that may
//! have gone to sleep (tens of µs on the 2-core VM, see [`crate::cpu::work_phases`]); the rayon
//! path paid it in every step (normalisation, product, conversion, summaries, gradient rows,
//! input gradient), which at B = 256 is a sizeable part of a 1–2 ms step. Here:
//!
//! - **forward**: normalise the rows and write `Êᵀ`; then, per chunk of query rows, its
//!   columns of `S = Ê Êᵀ` from its first row on (the upper triangle; `S` is symmetric) by gemm
//!   on the calling thread, widened to `f64`; then the rest of its rows copied from the rows
//!   above, and the rows' summaries;
//! - **backward**: the rows of `G = upstream · ∂loss/∂S` reduced to their non-zeros, the column
//!   lists (one chunk), the rows of `∂loss/∂x`; or, when `G` is dense, `G`'s rows, the rows of
//!   `G + Gᵀ` rounded to the embeddings' type, and per chunk its rows of `(G + Gᵀ) Ê` by gemm
//!   followed by the normalisation's backward pass.
//!
//! The arithmetic is that of the path it replaces: the same gemm kernels (one thread per block
//! of rows instead of gemm's own split, which does not split the inner dimension), the same
//! `f64` row logic, the same single rounding at the end.

use super::{
    check_norms, columns_of, finish_row, nonzeros_up_to, normalise_row, GradRows, Input, RowLoss,
    RowLossOp, SparseRows, UnitRows, SPARSE_BACKWARD_DENSITY,
};
use crate::cpu::host_sums::{vectorised, with_host_values, HostValues};
use crate::cpu::work_phases::{
    assume_written, filled, into_written, run_phases, unwritten, DisjointChunks, Phase,
};
use crate::error::{Error, Result};
use candle_core::{Device, Tensor, WithDType};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Query rows per chunk: two chunks per thread, so that a thread that joins late still finds
/// work, in multiples of 8 (the height of gemm's `f32` micro-kernel), and at most
/// [`MAX_CHUNK_VALUES`]`/B`. Chosen while each gemm call still repacked all of `Ê` (measured
/// at B = 256, D = 512, 2 threads: packing was 15% of the contrastive step with 32-row chunks;
/// the step took 0.84 / 0.75 / 1.07 ms with 32 / 64 / 256 rows). Reading `Êᵀ` has removed that
/// cost since; the size was kept (not re-measured) because the upper-triangle product wants
/// few chunks claimed in order, the costliest first.
fn rows_per_chunk(b: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let most = (MAX_CHUNK_VALUES / b.max(1) / 8 * 8).max(8);
    b.div_ceil(2 * threads).next_multiple_of(8).clamp(8, most)
}

/// Query rows per chunk of the forward pass: `B/16` rounded up to a multiple of 16, at least 16
/// and at most [`rows_per_chunk`], so there are about 16 chunks whatever the number of threads.
/// A multiple of 16 keeps each chunk's block of columns (from its first row on) as aligned to
/// gemm's 16-value `f32` micro-kernel as `B` itself is.
///
/// Why finer than the backward pass: each chunk computes the columns of `S` from its own first
/// row on, so the products computed beyond the upper triangle shrink with the chunk height (at
/// B = 256: 40 960 row × column products with 64-row chunks, 34 816 with 16-row ones, against
/// 32 896 for the triangle itself), and a thread that runs slower than the other (the 2-core
/// VM's vCPUs take turns at running 40% slower) holds up the end of a phase by one small chunk
/// only. Not finer still: the product reads all of `Êᵀ` once per chunk. Measured (contrastive,
/// D = 512, interleaved runs): B = 256 on 1 thread 0.92–0.93 → 0.79–0.80 ms, on 2 threads
/// 0.55–0.58 → 0.505–0.513 ms; B = 1024 (64 rows) 6.2–8.7 → 5.9–6.1 ms; B = 4096 (256 rows)
/// 123–135 → 108–114 ms. The backward pass keeps [`rows_per_chunk`]: its dense product
/// re-reads `Ê` in every chunk (FastAP B = 1024: 24.4 → 27.0 ms with 16-row chunks there).
fn forward_rows_per_chunk(b: usize) -> usize {
    const HEIGHT: usize = 16;
    const CHUNKS: usize = 16;
    let most = (rows_per_chunk(b) / HEIGHT * HEIGHT).max(HEIGHT);
    b.div_ceil(CHUNKS)
        .next_multiple_of(HEIGHT)
        .clamp(HEIGHT, most)
}

/// The side of the square tiles in which rows of `Ê` are copied into `Êᵀ`: each unit row
/// contributes 64-byte runs of `f32`, and each run written to `Êᵀ` is 16 values long.
const TRANSPOSE_ROWS: usize = 16;

/// Writes columns `i0..i0 + len` of `Eᵀ` (`d × b`, row-major, the buffer behind `et`) from
/// `rows`, rows `i0..i0 + len` of `E` (`len × d`, row-major), in square tiles of
/// [`TRANSPOSE_ROWS`]: reading a column of `E` directly strides by `d` values (2 KiB for `f32`
/// at D = 512), and those reads all fall in the same few sets of the L1 cache and miss
/// (measured: 12% of the contrastive step at B = 256 with a column-by-column copy).
///
/// # Safety
/// Columns `i0..i0 + len` of every row of `Eᵀ` must be the caller's alone while it runs.
unsafe fn transpose_into<T: Copy>(
    rows: &[T],
    (b, d): (usize, usize),
    i0: usize,
    et: &DisjointChunks<'_, std::mem::MaybeUninit<T>>,
) {
    const T_: usize = TRANSPOSE_ROWS;
    let len = rows.len() / d.max(1);
    let Some(&first) = rows.first() else {
        return;
    };
    let mut tile = [[first; T_]; T_];
    for j0 in (0..len).step_by(T_) {
        let jn = T_.min(len - j0);
        for k0 in (0..d).step_by(T_) {
            let kn = T_.min(d - k0);
            for (jj, t) in tile.iter_mut().enumerate().take(jn) {
                copy_run(t, &rows[(j0 + jj) * d + k0..], kn);
            }
            for k in 0..kn {
                // SAFETY: columns i0..i0 + len of row k0 + k are the caller's (contract).
                let out = unsafe { et.range_mut((k0 + k) * b + i0 + j0, jn) };
                for (o, t) in out.iter_mut().zip(&tile) {
                    o.write(t[k]);
                }
            }
        }
    }
}

/// `tile[..n] = from[..n]`: a full tile row (the usual case) is copied as a fixed-size array,
/// which compiles to a few vector moves; a copy of run-time length calls `memmove` (measured:
/// 5% of the 1-thread contrastive step at B = 256 went to those calls for 64–128-byte runs).
#[inline(always)]
fn copy_run<T: Copy>(tile: &mut [T; TRANSPOSE_ROWS], from: &[T], n: usize) {
    match from.first_chunk::<TRANSPOSE_ROWS>() {
        Some(full) if n == TRANSPOSE_ROWS => *tile = *full,
        _ => tile[..n].copy_from_slice(&from[..n]),
    }
}

/// The most values of a chunk's product block (16 MiB of `f32`): 1024 rows at B = 4096.
const MAX_CHUNK_VALUES: usize = 1 << 22;

/// `lhs · rhs` on the calling thread, row-major `m × n`: `lhs` is `m × k` row-major, `rhs` is
/// `k × n` read with the strides `(row, column)`. `T` is `f32` or `f64`.
fn product<T: WithDType>(
    (m, n, k): (usize, usize, usize),
    lhs: &[T],
    rhs: &[T],
    (rhs_rs, rhs_cs): (usize, usize),
) -> Vec<T> {
    // The bounds gemm relies on (it reads and writes through raw pointers).
    assert!(lhs.len() >= m * k, "product: lhs size");
    assert!(
        k == 0 || n == 0 || (k - 1) * rhs_rs + (n - 1) * rhs_cs < rhs.len(),
        "product: rhs strides"
    );
    if k == 0 {
        return vec![T::from_f64(0.0); m * n];
    }
    let mut dst = unwritten::<T>(m * n);
    // SAFETY: every element gemm touches lies inside the buffers (checked above): dst is
    // m × n with row stride n, lhs m × k with row stride k, rhs through the checked strides;
    // dst is a fresh allocation. With `read_dst = false` and k > 0, gemm writes every element
    // of dst and reads none, so dst may start unwritten and is then fully written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr() as *mut T,
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            T::from_f64(0.0),
            T::from_f64(1.0),
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
        into_written(dst)
    }
}

/// What the forward pass leaves: the unit rows, `S` (row-major `f64`) and the row summaries.
pub(super) struct Forward<Row> {
    pub unit: UnitRows,
    pub sims: Vec<f64>,
    pub rows: Vec<Row>,
}

/// The forward pass of the engine on contiguous `f32`/`f64` CPU embeddings `x` (detached);
/// `None` for anything else (the caller takes the general path).
pub(super) fn forward<R: RowLoss>(
    x: &Tensor,
    input: Input,
    loss: &R,
) -> Result<Option<Forward<R::Row>>> {
    let (b, d) = x.dims2()?;
    if b == 0 || d == 0 {
        return Ok(None);
    }
    let run = with_host_values(x, |v| match v {
        HostValues::F32(s) => forward_rows(s, (b, d), input, loss),
        HostValues::F64(s) => forward_rows(s, (b, d), input, loss),
    });
    let Some(result) = run else {
        return Ok(None);
    };
    let (unit, norms, sims, rows) = result?;
    let tensor = match unit {
        Some(t) => t,
        None => x.clone(),
    };
    Ok(Some(Forward {
        unit: UnitRows {
            tensor,
            norms,
            on_host: true,
            copy: None,
        },
        sims,
        rows,
    }))
}

/// The normalised rows (a tensor, `None` for [`Input::AsGiven`]), the norms, `S` and the row
/// summaries, in one [`run_phases`] call.
#[allow(clippy::type_complexity)]
fn forward_rows<T: WithDType + Into<f64>, R: RowLoss>(
    x: &[T],
    (b, d): (usize, usize),
    input: Input,
    loss: &R,
) -> Result<(Option<Tensor>, Option<Vec<f64>>, Vec<f64>, Vec<R::Row>)> {
    let normalise = input == Input::Normalise;
    let rows = forward_rows_per_chunk(b);
    let chunks = b.div_ceil(rows);
    let (mut unit, mut norms) = if normalise {
        (unwritten::<T>(b * d), vec![0.0f64; b])
    } else {
        (Vec::new(), Vec::new())
    };
    let mut sims = unwritten::<f64>(b * b);
    // Êᵀ (D × B, row-major): the product's right operand. gemm computes a row-major result as
    // its transpose and reads that operand as its left one, which it copies into a packed
    // buffer on every call unless it is column-major; reading Êᵀ instead of Ê spares that copy
    // (measured at B = 256: 10% of the contrastive step with one call per chunk).
    let mut transposed = unwritten::<T>(d * b);
    let mut summaries: Vec<Option<R::Row>> = (0..b).map(|_| None).collect();
    let bad_norm = AtomicBool::new(false);
    {
        let unit_parts = DisjointChunks::new(&mut unit, rows * d);
        let norm_parts = DisjointChunks::new(&mut norms, rows);
        let sim_parts = DisjointChunks::new(&mut sims, rows * b);
        let transposed_parts = DisjointChunks::new(&mut transposed, b);
        let summary_parts = DisjointChunks::new(&mut summaries, rows);
        // Per chunk of rows: normalise them (when asked), then write them as columns of Êᵀ
        // while they are still in the cache, in one phase (one pass over E, one wait fewer), so
        // the thread that owns those rows ([`run_phases`]) writes their columns of Êᵀ too.
        // Measured (contrastive B = 256, 2 threads, alternating runs): 0.486 → 0.474 ms against
        // a transposition by blocks of Êᵀ rows, which read every thread's rows.
        let prepare_chunk = |c: usize| {
            let (i0, len) = (c * rows, rows.min(b - c * rows));
            let e_rows: &[T] = if normalise {
                // SAFETY: chunk c is the only writer of part c of both buffers, and nothing
                // reads them during this phase.
                let (u, n) = unsafe { (unit_parts.part_mut(c), norm_parts.part_mut(c)) };
                let xs = &x[i0 * d..][..u.len()];
                vectorised(
                    #[inline(always)]
                    || {
                        for ((u, row), n) in u.chunks_mut(d).zip(xs.chunks(d)).zip(n.iter_mut()) {
                            *n = normalise_row(row, u);
                        }
                    },
                );
                if n.iter().any(|&n| n <= 0.0 || !n.is_finite()) {
                    bad_norm.store(true, Ordering::Relaxed);
                    return; // reported after the pass
                }
                // SAFETY: every element of the part was written above (a row of `u` per row
                // of `xs`).
                unsafe { assume_written(u) }
            } else {
                &x[i0 * d..(i0 + len) * d]
            };
            // SAFETY: columns i0..i0 + len of Êᵀ are this chunk's rows, written by it alone.
            unsafe { transpose_into(e_rows, (b, d), i0, &transposed_parts) };
        };
        // SAFETY: every unit row was written in the preparation phase, which precedes the
        // phases that call it.
        let rows_of_e = || -> &[T] {
            if normalise {
                unsafe { assume_written(unit_parts.whole()) }
            } else {
                x
            }
        };
        // S is symmetric, so each chunk of query rows computes only its columns from its first
        // row on (the upper triangle and the diagonal blocks: 17/32 of the products at B = 256
        // with sixteen chunks), and the next phase copies the rest from the rows above, so
        // `S[i, j]` and `S[j, i]` are the same float. Up to D = 512 at least (tested), gemm
        // accumulates every entry over the same sequence of `k` whatever the block's shape, and
        // S is bit for bit the full product; wider rows may be split differently (tested:
        // equal up to rounding).
        let upper_chunk = |c: usize| {
            if bad_norm.load(Ordering::Relaxed) {
                return; // reported after the pass; S of a zero row is not finite
            }
            // SAFETY: Êᵀ was written in the previous phase.
            let (e, et) = (rows_of_e(), unsafe {
                assume_written(transposed_parts.whole())
            });
            let (i0, len) = (c * rows, rows.min(b - c * rows));
            let width = b - i0;
            let block = product(
                (len, width, d),
                &e[i0 * d..(i0 + len) * d],
                &et[i0..],
                (b, 1),
            );
            for (k, from) in block.chunks(width).enumerate() {
                // SAFETY: row i0 + k, columns i0.., belongs to this chunk; nothing else
                // touches it in this phase.
                let to = unsafe { sim_parts.range_mut((i0 + k) * b + i0, width) };
                vectorised(
                    #[inline(always)]
                    || {
                        for (s, &v) in to.iter_mut().zip(from) {
                            s.write(v.into());
                        }
                    },
                );
            }
        };
        let lower_chunk = |c: usize| {
            if bad_norm.load(Ordering::Relaxed) {
                return;
            }
            let (i0, len) = (c * rows, rows.min(b - c * rows));
            // S[i, j] = S[j, i] for j < i0, in square tiles (a column of S strides by B).
            // SAFETY: this chunk writes columns ..i0 of its own rows and reads columns
            // i0..i0 + len of the rows above, which the previous phase wrote and which no
            // chunk writes in this phase (a chunk writes only columns left of its first row).
            const T_: usize = TRANSPOSE_ROWS;
            let mut tile = [[0.0f64; T_]; T_];
            for j0 in (0..i0).step_by(T_) {
                let jn = T_.min(i0 - j0);
                for k0 in (0..len).step_by(T_) {
                    let kn = T_.min(len - k0);
                    for (jj, t) in tile.iter_mut().enumerate().take(jn) {
                        let from = unsafe { sim_parts.range((j0 + jj) * b + i0 + k0, kn) };
                        let from = unsafe { assume_written(from) };
                        copy_run(t, from, kn);
                    }
                    for k in 0..kn {
                        let to = unsafe { sim_parts.range_mut((i0 + k0 + k) * b + j0, jn) };
                        for (s, t) in to.iter_mut().zip(&tile) {
                            s.write(t[k]);
                        }
                    }
                }
            }
            // SAFETY: every column of this chunk's rows is now written (columns ..i0 above,
            // i0.. in the previous phase); part c of the summaries is this chunk's alone.
            let out = unsafe { summary_parts.part_mut(c) };
            for (k, slot) in out.iter_mut().enumerate() {
                let row = unsafe { assume_written(sim_parts.range((i0 + k) * b, b)) };
                *slot = Some(loss.summarise(i0 + k, row));
            }
        };
        run_phases(&[
            Phase::new(chunks, &prepare_chunk),
            Phase::new(chunks, &upper_chunk),
            Phase::new(chunks, &lower_chunk),
        ]);
    }
    if bad_norm.into_inner() {
        check_norms(&norms)?;
        return Err(Error::invalid(
            "embeddings",
            "internal: a norm check failed",
        ));
    }
    // SAFETY: with every norm valid, the two similarity phases wrote every element of `sims`
    // (columns from each chunk's first row on, then the rest), and the normalisation phase
    // every row of `unit`.
    let (sims, unit) = unsafe { (into_written(sims), into_written(unit)) };
    let rows: Vec<R::Row> = summaries
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| Error::invalid("embeddings", "internal: a row was not summarised"))?;
    if !normalise {
        return Ok((None, None, sims, rows));
    }
    let tensor = Tensor::from_vec(unit, (b, d), &Device::Cpu)?;
    Ok((Some(tensor), Some(norms), sims, rows))
}

/// `∂loss/∂x` of the op on the host path without an `f64` copy of `Ê` (`f32`/`f64` CPU
/// embeddings), from the kept `S`; `None` when the op is on another path.
pub(super) fn backward<R: RowLoss>(
    op: &RowLossOp<R>,
    sims: &[f64],
    upstream: f64,
) -> Result<Option<Tensor>> {
    let unit = &op.unit;
    if !unit.on_host || unit.copy.is_some() {
        return Ok(None);
    }
    let (b, d) = unit.tensor.dims2()?;
    if b == 0 || d == 0 {
        return Ok(None);
    }
    let norms = unit.norms.as_deref();
    let run = with_host_values(&unit.tensor, |v| match v {
        HostValues::F32(u) => {
            let g = BackwardRows::new(op, sims, u, norms, (b, d), upstream).run();
            Tensor::from_vec(g, (b, d), &Device::Cpu)
        }
        HostValues::F64(u) => {
            let g = BackwardRows::new(op, sims, u, norms, (b, d), upstream).run();
            Tensor::from_vec(g, (b, d), &Device::Cpu)
        }
    });
    Ok(run.transpose()?)
}

/// What both forms of the backward pass read: the op (loss, summaries), `S`, `Ê` and the norms
/// of the normalisation (`None`: [`Input::AsGiven`]), and the chunking of the rows.
struct BackwardRows<'a, T, R: RowLoss> {
    op: &'a RowLossOp<R>,
    sims: &'a [f64],
    unit: &'a [T],
    norms: Option<&'a [f64]>,
    b: usize,
    d: usize,
    upstream: f64,
    /// Rows per chunk ([`rows_per_chunk`]) and the number of chunks.
    rows: usize,
    chunks: usize,
}

impl<'a, T: WithDType + Into<f64>, R: RowLoss> BackwardRows<'a, T, R> {
    fn new(
        op: &'a RowLossOp<R>,
        sims: &'a [f64],
        unit: &'a [T],
        norms: Option<&'a [f64]>,
        (b, d): (usize, usize),
        upstream: f64,
    ) -> Self {
        let rows = rows_per_chunk(b);
        BackwardRows {
            op,
            sims,
            unit,
            norms,
            b,
            d,
            upstream,
            rows,
            chunks: b.div_ceil(rows),
        }
    }

    /// Writes `upstream · ∂loss/∂S[q, ·]` into `out` (zeroed).
    fn row_grad(&self, q: usize, out: &mut [f64]) {
        let row = &self.sims[q * self.b..(q + 1) * self.b];
        self.op.row_grad(q, row, self.upstream, out);
    }

    /// Row `i` of `∂loss/∂x` into `o` from row `g` of `∂loss/∂Ê` ([`finish_row`]).
    #[inline(always)]
    fn finish(&self, i: usize, g: &[f64], o: &mut [std::mem::MaybeUninit<T>]) {
        let d = self.d;
        finish_row::<T, T, _>(
            g,
            &self.unit[i * d..(i + 1) * d],
            self.norms.map(|n| n[i]),
            o,
        );
    }

    /// `∂loss/∂x` (row-major, the embeddings' type): sparse when `G + Gᵀ` has few enough
    /// non-zeros ([`SPARSE_BACKWARD_DENSITY`]), else the dense product.
    fn run(&self) -> Vec<T> {
        let Self {
            unit,
            b,
            d,
            rows,
            chunks,
            ..
        } = *self;
        // A row with more than B/4 non-zeros ends the sparse attempt at once (a dense loss such
        // as FastAP wastes one row per thread, and the lists never hold more than B²/4 entries).
        let cap = b / 4;
        let mut lists: Vec<Vec<(usize, f64)>> = vec![Vec::new(); b];
        let mut out = unwritten::<T>(b * d);
        let dense = AtomicBool::new(false);
        let columns: OnceLock<Vec<Vec<(usize, f64)>>> = OnceLock::new();
        {
            let list_parts = DisjointChunks::new(&mut lists, rows);
            let out_parts = DisjointChunks::new(&mut out, rows * d);
            let list_chunk = |c: usize| {
                // SAFETY: part c is written by chunk c only; nothing reads the lists meanwhile.
                let part = unsafe { list_parts.part_mut(c) };
                let mut scratch = vec![0.0f64; b];
                for (k, list) in part.iter_mut().enumerate() {
                    if dense.load(Ordering::Relaxed) {
                        return;
                    }
                    self.row_grad(c * rows + k, &mut scratch);
                    match nonzeros_up_to(&scratch, cap) {
                        Some(l) => {
                            // Zero again only the entries the list holds (instead of the
                            // whole row): every other entry is a zero already (possibly −0,
                            // which a row gradient adds to like +0).
                            for &(j, _) in &l {
                                scratch[j] = 0.0;
                            }
                            *list = l;
                        }
                        None => {
                            dense.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            };
            let column_chunk = |_: usize| {
                if dense.load(Ordering::Relaxed) {
                    return;
                }
                // SAFETY: the lists were written in the previous phase.
                let lists = unsafe { list_parts.whole() };
                let nonzero: usize = lists.iter().map(Vec::len).sum();
                // G + Gᵀ has at most twice the non-zeros of G.
                if (2 * nonzero) as f64 > SPARSE_BACKWARD_DENSITY * (b * b) as f64 {
                    dense.store(true, Ordering::Relaxed);
                    return;
                }
                let _ = columns.set(columns_of(lists, b));
            };
            let gradient_chunk = |c: usize| {
                let Some(columns) = columns.get() else {
                    return;
                };
                // SAFETY: the lists were written two phases ago; part c of `out` is ours.
                // `finish` writes every element of each row of the part.
                let (lists, o) = unsafe { (list_parts.whole(), out_parts.part_mut(c)) };
                let src = SparseRows {
                    rows: lists,
                    columns,
                    unit,
                    d,
                };
                let mut g = vec![0.0f64; d];
                vectorised(
                    #[inline(always)]
                    || {
                        for (k, o) in o.chunks_mut(d).enumerate() {
                            let i = c * rows + k;
                            g.fill(0.0);
                            src.add_row(i, &mut g);
                            self.finish(i, &g, o);
                        }
                    },
                );
            };
            run_phases(&[
                Phase::new(chunks, &list_chunk),
                Phase::new(1, &column_chunk),
                Phase::new(chunks, &gradient_chunk),
            ]);
        }
        if columns.get().is_some() {
            // SAFETY: the gradient phase wrote every row of `out`.
            return unsafe { into_written(out) };
        }
        drop(lists);
        self.dense(out)
    }

    /// The dense backward pass into `out`: rows of `G`, rows of `G + Gᵀ` in the embeddings'
    /// type (what the products of the general path see), then per chunk of rows `(G + Gᵀ) Ê`
    /// and the normalisation's backward pass.
    fn dense(&self, mut out: Vec<std::mem::MaybeUninit<T>>) -> Vec<T> {
        let Self {
            unit,
            b,
            d,
            rows,
            chunks,
            ..
        } = *self;
        let mut g = unwritten::<f64>(b * b);
        let mut sym = unwritten::<T>(b * b);
        {
            let g_parts = DisjointChunks::new(&mut g, rows * b);
            let sym_parts = DisjointChunks::new(&mut sym, rows * b);
            let out_parts = DisjointChunks::new(&mut out, rows * d);
            let grad_chunk = |c: usize| {
                // SAFETY: part c is written by chunk c only; nothing reads G meanwhile.
                // `row_grad` adds to a zeroed row.
                let part = filled(unsafe { g_parts.part_mut(c) }, 0.0);
                for (k, row) in part.chunks_mut(b).enumerate() {
                    self.row_grad(c * rows + k, row);
                }
            };
            let symmetric_chunk = |c: usize| {
                // SAFETY: G was written in the previous phase; part c of `sym` is ours.
                let (g, part) = unsafe { (assume_written(g_parts.whole()), sym_parts.part_mut(c)) };
                let (i0, len) = (c * rows, part.len() / b);
                // Column-outer order: the transposed reads g[j, i0..i0+len] are contiguous.
                for j in 0..b {
                    let column = &g[j * b + i0..j * b + i0 + len];
                    for (k, &gji) in column.iter().enumerate() {
                        part[k * b + j].write(T::from_f64(g[(i0 + k) * b + j] + gji));
                    }
                }
            };
            let product_chunk = |c: usize| {
                // SAFETY: the rows of `sym` were written in the previous phase; part c of
                // `out` is ours.
                // `finish` writes every element of each row of the part.
                let (sym, o) =
                    unsafe { (assume_written(sym_parts.whole()), out_parts.part_mut(c)) };
                let (i0, len) = (c * rows, o.len() / d);
                let block = product((len, d, b), &sym[i0 * b..(i0 + len) * b], unit, (d, 1));
                let mut g = vec![0.0f64; d];
                vectorised(
                    #[inline(always)]
                    || {
                        for (k, (o, row)) in o.chunks_mut(d).zip(block.chunks(d)).enumerate() {
                            for (g, &v) in g.iter_mut().zip(row) {
                                *g = v.into();
                            }
                            self.finish(i0 + k, &g, o);
                        }
                    },
                );
            };
            run_phases(&[
                Phase::new(chunks, &grad_chunk),
                Phase::new(chunks, &symmetric_chunk),
                Phase::new(chunks, &product_chunk),
            ]);
        }
        // SAFETY: the product phase wrote every row of `out`.
        unsafe { into_written(out) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_transpose_matches_the_definition() {
        // Neither dimension a multiple of the tile (short tiles at both ends), written by
        // blocks of rows of several heights as the chunks of the forward pass do.
        let (b, d) = (37, 21);
        let e: Vec<f32> = (0..b * d).map(|i| i as f32).collect();
        for height in [1, 5, 16, 20, 37] {
            let mut t = unwritten::<f32>(d * b);
            {
                let parts = DisjointChunks::new(&mut t, b);
                for (c, rows) in e.chunks(height * d).enumerate() {
                    // SAFETY: each block writes its own columns; the blocks run in turn.
                    unsafe { transpose_into(rows, (b, d), c * height, &parts) };
                }
            }
            // SAFETY: the blocks cover every column of Eᵀ.
            let t = unsafe { into_written(t) };
            for k in 0..d {
                for j in 0..b {
                    assert_eq!(t[k * b + j], e[j * d + k], "height {height}: ({k}, {j})");
                }
            }
        }
    }

    #[test]
    fn product_matches_the_plain_sum() {
        // Sizes off gemm's tile sizes, and both stride patterns the engine uses.
        let (m, n, k) = (13, 29, 7);
        let lhs: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 11) as f64) - 5.0).collect();
        let rows: Vec<f64> = (0..n * k).map(|i| ((i * 5 % 13) as f64) / 4.0).collect();
        let cols: Vec<f64> = (0..k * n).map(|i| rows[(i % n) * k + i / n]).collect();
        // rhs = rowsᵀ read from `rows` (n × k) with strides (1, k), or from `cols` (k × n,
        // row-major) with strides (n, 1): the same matrix.
        for (rhs, strides) in [(&rows, (1, k)), (&cols, (n, 1))] {
            let got = product((m, n, k), &lhs, rhs, strides);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|t| lhs[i * k + t] * rows[j * k + t]).sum();
                    assert!((got[i * n + j] - want).abs() < 1e-12, "({i}, {j})");
                }
            }
        }
    }

    /// Keeps the summaries' rows as they are, to look at `S`.
    struct KeepRows;

    impl RowLoss for KeepRows {
        type Row = Vec<f64>;
        type Global = ();
        fn summarise(&self, _: usize, sims: &[f64]) -> Vec<f64> {
            sims.to_vec()
        }
        fn global(&self, _: &[Vec<f64>]) -> Result<()> {
            Ok(())
        }
        fn value(&self, _: &()) -> f64 {
            0.0
        }
        fn row_grad(&self, _: usize, _: &[f64], _: &Vec<f64>, _: &(), _: f64, _: &mut [f64]) {}
    }

    #[test]
    fn mirrored_similarities_equal_the_full_product_bit_for_bit() {
        // f32 rows, B not a multiple of the chunk height: S from the upper blocks and their
        // mirror image must be exactly the full product (widened), both triangles, at D = 512
        // (the benchmarks' width) as well as a small one.
        for (b, d) in [(150, 37), (300, 512)] {
            mirrored_against_full(b, d, true);
        }
        // Wider rows take gemm through more than one block of the inner dimension, whose
        // split may depend on the block's shape: S is then the product up to rounding, and
        // still exactly symmetric.
        mirrored_against_full(300, 700, false);
    }

    fn mirrored_against_full(b: usize, d: usize, bit_for_bit: bool) {
        let data: Vec<f32> = (0..b * d)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) / 97.0)
            .collect();
        let x = Tensor::from_vec(data, (b, d), &Device::Cpu).unwrap();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let f = pool
                .install(|| forward(&x, Input::Normalise, &KeepRows))
                .unwrap()
                .unwrap();
            let e: Vec<f32> = f.unit.tensor.flatten_all().unwrap().to_vec1().unwrap();
            let full = product((b, b, d), &e, &e, (1, d));
            for i in 0..b {
                for j in 0..b {
                    let (got, want) = (f.sims[i * b + j], f64::from(full[i * b + j]));
                    assert_eq!(got.to_bits(), f.sims[j * b + i].to_bits(), "({i}, {j})");
                    assert_eq!(f.rows[i][j].to_bits(), got.to_bits(), "row ({i}, {j})");
                    if bit_for_bit {
                        assert_eq!(got.to_bits(), want.to_bits(), "({i}, {j})");
                    } else {
                        assert!((got - want).abs() <= 1e-5, "({i}, {j}): {got} {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn chunks_are_multiples_of_eight_rows_and_bounded() {
        for b in [1, 7, 64, 256, 1000, 4096, 100_000] {
            let r = rows_per_chunk(b);
            assert!(r.is_multiple_of(8) && r >= 8, "B = {b}: {r}");
            assert!(r * b <= MAX_CHUNK_VALUES.max(8 * b), "B = {b}: {r}");
            let f = forward_rows_per_chunk(b);
            assert!(
                f.is_multiple_of(16) && f >= 16 && f <= r.max(16),
                "B = {b}: {f}"
            );
        }
        assert_eq!(
            [256, 384, 1024, 4096].map(forward_rows_per_chunk),
            [16, 32, 64, 256]
        );
    }
}

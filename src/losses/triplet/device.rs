//! The triplet loss on a CUDA device: its mining by a kernel of its own, its cost and gradient
//! by candle's autograd, with no host pass.
//!
//! The row engine of [`super::Triplet`] sorts each anchor's distances on the host: on a GPU the
//! `B × B` similarities travel to the host and the gradient back, which made the semi-hard
//! triplet loss 0.73× PyTorch's all-on-GPU formulation at B = 256 on the H200 (2026-11-26).
//! Here the kernels of `device.cu` beside this file count, for every anchor `a` and item `j`,
//! the active triplets `j` takes part in — `k⁺_aj` as a positive, `k⁻_aj` as a negative — and
//! the sum of their costs `c_aj` for a positive, from the distance-like values `x` (`x = −s`):
//!
//! ```text
//! all, semi-hard (thread (a, j)):  k⁺_ap = |{n : mined(a, p, n), (x_ap − x_an) + m > 0}|,
//!                                  c_ap  = Σ_n over those of (x_ap − x_an) + m,  k⁻_an likewise
//! easy positive (thread a):        p = argmin_{positives} x_ap, n = argmin_{negatives, x_an > x_ap} x_an
//!                                  (first column on ties); one triplet if it costs
//! loss  L = Σ c / K,  K = Σ k⁺ (the non-zero triplets; L = 0 when K = 0)
//! ∂L/∂x_aj = (k⁺_aj − k⁻_aj) / K
//! ```
//!
//! — the module documentation's mean non-zero cost, with the row engine's minings (semi-hard:
//! `0 < x_an − x_ap ≤ m`). Two more kernels reduce them (each anchor's row, then one thread
//! totals the rows in order into `L` and the divisor `max(K, 1)`), and the backward pass is one
//! kernel writing `∂x = g (k⁺ − k⁻) / max(K, 1)` from the counts and the divisor that the op
//! keeps on the device (the counts carry no gradient: the mining is piecewise constant), instead
//! of a dozen candle operations for the reduction and the Jacobian; autograd takes `∂x` through
//! `x = −Ê Êᵀ` and the normalisation to the embeddings, on the device. All-or-semi-hard mining
//! is one thread per pair: a positive's thread scans the anchor's row for its negatives, a
//! negative's the anchor's positives alone (the batch's items listed by class on the host), so
//! the work is `O(B · Σ_a P_a)`, `P_a` the positives of anchor `a` — `O(B² m)` for `m` images per
//! class, where scanning the whole row for every pair was `O(B³)` — and the kernels are used while
//! `B · Σ_a P_a ≤` [`crate::kernels::max_work`], the easy-positive mining (`O(B²)`) up to `B ≤`
//! [`MAX_EASY_BATCH`]; beyond, the row engine.
//! Cosine similarity only (the Euclidean distance's gradient at a duplicate pair would not be
//! torch's through autograd).
//!
//! **Tests.** The unit tests compile `device.cu` with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/triplet.cpp`) and check the kernels' value and `∂x`,
//! taken through autograd to the embeddings, against the row engine for the three minings; the
//! GPU check compares every triplet loss on CUDA with the CPU.

use super::{Triplet, TripletMining};
use crate::error::Result;
use crate::hierarchy::Labels;
use crate::losses::pairwise_rows::PairMetric;
use crate::losses::{dense_fine_ids, l2_normalize};
use candle_core::Tensor;

/// Largest batch for the easy-positive mining on the device (`O(B²)` work and memory).
pub const MAX_EASY_BATCH: usize = 1 << 16;

/// The batch's dense class ids when `loss` on `embeddings` runs on the device, `None` when the
/// row engine does. The device takes it on [`crate::kernels::on_cuda`], with cosine similarity,
/// no query chunk asked, and the batch within the mining's bound (all and semi-hard: the work
/// `B · Σ_a P_a`, `P_a` the positives of anchor `a`, at most [`crate::kernels::max_work`]).
pub(super) fn plan(loss: &Triplet, embeddings: &Tensor, labels: &Labels) -> Option<Vec<u32>> {
    let b = embeddings.dim(0).ok()?;
    // The device and the options first: the work is counted from the labels only for a batch
    // that could take the kernels.
    if loss.metric != PairMetric::Cosine
        || loss.query_chunk.is_some()
        || !crate::kernels::on_cuda(embeddings)
    {
        return None;
    }
    let ids = dense_fine_ids(labels);
    let within = match loss.mining {
        TripletMining::EasyPositiveSemiHardNegative => b <= MAX_EASY_BATCH,
        TripletMining::All | TripletMining::SemiHard => {
            work(&ids).is_some_and(|w| w <= crate::kernels::max_work())
        }
    };
    within.then_some(ids)
}

/// The all-or-semi-hard mining's work on the batch of dense class ids `ids`: `B · Σ_a P_a`
/// (each anchor's positives scan the `B` items; as many (anchor, negative) threads scan the
/// anchor's positives), `None` on overflow.
fn work(ids: &[u32]) -> Option<usize> {
    let (start, _) = class_lists(ids);
    let size = |c: u32| (start[c as usize + 1] - start[c as usize]) as usize;
    let pairs: usize = ids.iter().map(|&c| size(c) - 1).sum();
    pairs.checked_mul(ids.len())
}

/// The items of each class of the dense ids `ids` (`0..C`), in increasing order: class `c`'s
/// are `items[start[c]..start[c + 1]]` (a counting sort) — the positives the mining kernel's
/// negative threads visit.
fn class_lists(ids: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let classes = ids.iter().max().map_or(0, |&m| m as usize + 1);
    let mut start = vec![0u32; classes + 1];
    for &c in ids {
        start[c as usize + 1] += 1;
    }
    for c in 0..classes {
        start[c + 1] += start[c];
    }
    let mut next = start.clone();
    let mut items = vec![0u32; ids.len()];
    for (i, &c) in ids.iter().enumerate() {
        items[next[c as usize] as usize] = i as u32;
        next[c as usize] += 1;
    }
    (start, items)
}

/// The mining's code in `device.cu`.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn mining_code(m: TripletMining) -> u32 {
    match m {
        TripletMining::All => 0,
        TripletMining::SemiHard => 1,
        TripletMining::EasyPositiveSemiHardNegative => 2,
    }
}

/// `x = −Ê Êᵀ` of the batch, differentiable.
fn distances(embeddings: &Tensor) -> Result<Tensor> {
    let e = l2_normalize(embeddings, "embeddings")?;
    PairMetric::Cosine.distance_matrix(&e.matmul(&e.t()?)?)
}

/// The triplet loss with the mining on the device (see the module documentation), `ids` the
/// batch's dense class ids ([`plan`]).
pub(super) fn forward(
    loss: &Triplet,
    embeddings: &Tensor,
    labels: &Labels,
    ids: Vec<u32>,
) -> Result<Tensor> {
    super::check_candidates(labels)?;
    let x = distances(embeddings)?;
    mined_cost(&x, ids, loss.margin, loss.mining)
}

#[cfg(feature = "cuda")]
fn mined_cost(x: &Tensor, ids: Vec<u32>, margin: f64, mining: TripletMining) -> Result<Tensor> {
    let loss = cuda::MinedCost {
        ids,
        margin,
        mining: mining_code(mining),
    };
    Ok(crate::kernels::loss_op::apply(x, loss)?)
}

#[cfg(not(feature = "cuda"))]
fn mined_cost(_: &Tensor, _: Vec<u32>, _: f64, _: TripletMining) -> Result<Tensor> {
    Err(crate::error::Error::invalid(
        "device",
        "the triplet mining kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::kernels::loss_op::KernelLoss;
    use crate::kernels::{instance, per_entry, per_row, ptx, Float};
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::Layout;
    use std::sync::Arc;

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_triplet";

    /// The mined triplets' mean cost from the `B × B` distances `x`.
    pub(super) struct MinedCost {
        pub(super) ids: Vec<u32>,
        pub(super) margin: f64,
        pub(super) mining: u32,
    }

    /// What the forward pass leaves on the device for the backward pass: the counts `k⁺ − k⁻`
    /// (`B × B`) and the divisor `max(K, 1)`.
    #[derive(Clone)]
    pub(super) struct Saved {
        counts: Arc<CudaSlice<f64>>,
        divisor: Arc<CudaSlice<f64>>,
    }

    impl KernelLoss for MinedCost {
        type Saved = Saved;
        const NAME: &'static str = "rankwise-triplet-mining";
        const GRAD_NAME: &'static str = "rankwise-triplet-mining-grad";

        fn dims(&self, _: &Layout) -> (usize, usize) {
            (self.ids.len(), self.ids.len())
        }

        fn forward<T: Float>(
            &self,
            dev: &CudaDevice,
            x: &CudaView<T>,
            (b, _): (usize, usize),
        ) -> candle_core::Result<(CudaSlice<T>, Saved)> {
            let nb = b as u32;
            let func = |name: &str| dev.get_or_load_custom_func(name, MODULE, ptx(MODULE, SOURCE)?);
            let cls = dev.clone_htod(&self.ids)?;
            // The minings write only the entries they count (and no diagonal): zeros first.
            let mut counts = dev.alloc_zeros::<f64>(b * b)?;
            let mut partial = dev.alloc_zeros::<f64>(b * b)?;
            if self.mining == 2 {
                let f = func(&instance::<T>("rankwise_triplet_easy"))?;
                let mut l = f.builder();
                l.arg(x)
                    .arg(&cls)
                    .arg(&nb)
                    .arg(&self.margin)
                    .arg(&mut counts)
                    .arg(&mut partial);
                // SAFETY: `x`, `counts` and `partial` hold `B × B` values, `cls` `B`.
                unsafe { l.launch(per_row(b)) }.w()?;
            } else {
                let (class_start, class_items) = super::class_lists(&self.ids);
                let class_start = dev.clone_htod(&class_start)?;
                let class_items = dev.clone_htod(&class_items)?;
                let f = func(&instance::<T>("rankwise_triplet_pairs"))?;
                let mining = self.mining as i32;
                let mut l = f.builder();
                l.arg(x)
                    .arg(&cls)
                    .arg(&class_start)
                    .arg(&class_items)
                    .arg(&nb)
                    .arg(&self.margin)
                    .arg(&mining)
                    .arg(&mut counts)
                    .arg(&mut partial);
                // SAFETY: as above; `class_start` holds `C + 1` offsets into `class_items`, the
                // `B` items listed by class, and the ids are below `C`.
                unsafe { l.launch(per_entry(b, b)) }.w()?;
            }
            // SAFETY (the three allocations): the row kernel writes all 2 B row sums, the total
            // kernel the loss and the divisor, before anything reads them.
            let mut rows = unsafe { dev.alloc::<f64>(2 * b)? };
            let mut loss = unsafe { dev.alloc::<T>(1)? };
            let mut divisor = unsafe { dev.alloc::<f64>(1)? };
            let f = func("rankwise_triplet_rows")?;
            let mut l = f.builder();
            l.arg(&counts).arg(&partial).arg(&nb).arg(&mut rows);
            // SAFETY: `counts` and `partial` hold `B × B` values, `rows` 2 B.
            unsafe { l.launch(per_row(b)) }.w()?;
            let f = func(&instance::<T>("rankwise_triplet_total"))?;
            let mut l = f.builder();
            l.arg(&rows).arg(&nb).arg(&mut loss).arg(&mut divisor);
            // SAFETY: one thread reads the 2 B row sums and writes one loss and one divisor.
            unsafe { l.launch(per_row(1)) }.w()?;
            let saved = Saved {
                counts: Arc::new(counts),
                divisor: Arc::new(divisor),
            };
            Ok((loss, saved))
        }

        fn backward<T: Float>(
            &self,
            dev: &CudaDevice,
            _: &CudaView<T>,
            g: &CudaView<T>,
            saved: &Saved,
            (b, _): (usize, usize),
        ) -> candle_core::Result<CudaSlice<T>> {
            let nb = b as u32;
            // SAFETY: the kernel writes every one of the B × B values.
            let mut dx = unsafe { dev.alloc::<T>(b * b)? };
            let f = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_triplet_grad"),
                MODULE,
                ptx(MODULE, SOURCE)?,
            )?;
            let mut l = f.builder();
            l.arg(saved.counts.as_ref())
                .arg(saved.divisor.as_ref())
                .arg(g)
                .arg(&mut dx)
                .arg(&nb);
            // SAFETY: `counts` and `dx` hold B × B values, the divisor and `g` one.
            unsafe { l.launch(per_entry(b, b)) }.w()?;
            Ok(dx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::RankLoss;
    use candle_core::{DType, Device, Var};

    /// What the harness returns: the mining's counts and partial sums, the loss, the divisor
    /// `max(K, 1)` and `∂x` for the incoming gradient.
    struct Emulated {
        counts: Vec<f64>,
        partial: Vec<f64>,
        loss: f64,
        divisor: f64,
        dx: Vec<f64>,
    }

    /// The kernels of `device.cu` run on the host by the harness (launch grid emulated with
    /// blocks of 5 threads), the incoming gradient `g`.
    fn emulate(
        x: &[f64],
        f32_x: bool,
        ids: &[u32],
        margin: f64,
        mining: TripletMining,
        g: f64,
    ) -> Emulated {
        let b = ids.len();
        let mut input = Vec::new();
        for v in [b as u32, mining_code(mining), u32::from(f32_x)] {
            input.extend(v.to_le_bytes());
        }
        input.extend(margin.to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, x, f32_x);
        let (start, items) = class_lists(ids);
        input.extend((start.len() as u32 - 1).to_le_bytes());
        for &c in ids.iter().chain(&start).chain(&items) {
            input.extend(c.to_le_bytes());
        }
        crate::kernels::emulation::push_values(&mut input, &[g], f32_x);
        let out = crate::kernels::emulation::run("triplet", &input);
        let bb = b * b;
        assert_eq!(out.len(), 3 * bb + 2);
        Emulated {
            counts: out[..bb].to_vec(),
            partial: out[bb..2 * bb].to_vec(),
            loss: out[2 * bb],
            divisor: out[2 * bb + 1],
            dx: out[2 * bb + 2..].to_vec(),
        }
    }

    /// Value and embeddings' gradient of `loss` by the row engine and by the emulated kernels
    /// (their loss and `∂x`), for embeddings of `dtype`.
    fn both(
        loss: &Triplet,
        labels: &Labels,
        e: &[f64],
        d: usize,
        dtype: DType,
    ) -> [(f64, Vec<f64>); 2] {
        let b = labels.len();
        let var = Var::from_tensor(
            &Tensor::from_vec(e.to_vec(), (b, d), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        let grad_of = |l: Tensor| {
            let g = l.backward().unwrap();
            let v = l.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
            let g = g
                .get(var.as_tensor())
                .map(|g| {
                    g.to_dtype(DType::F64)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap()
                })
                .unwrap_or_else(|| vec![0.0; b * d]);
            (v, g)
        };
        let reference = grad_of(loss.forward(var.as_tensor(), labels).unwrap());
        let x = distances(var.as_tensor()).unwrap();
        let xs: Vec<f64> = x
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let ids = dense_fine_ids(labels);
        let k = emulate(
            &xs,
            dtype == DType::F32,
            &ids,
            loss.margin,
            loss.mining,
            1.0,
        );
        let attached = crate::kernels::emulation::attach_loss(&x, k.loss, k.dx);
        [reference, grad_of(attached)]
    }

    #[test]
    fn the_kernels_equal_the_row_engine_for_the_three_minings() {
        let (b, d) = (29, 6);
        let fine: Vec<i64> = (0..b as i64).map(|i| (i * 7) % 6 - 3).collect();
        let labels = Labels::from_fine(&fine).unwrap();
        // Items 7 and 8 duplicate items 1 and 2 of their classes (class = i mod 6): tied
        // positives and tied negatives for the easy-positive mining's first-column rule.
        let mut e = crate::kernels::emulation::uniform(b * d, 5);
        for (from, to) in [(1, 7), (2, 8)] {
            let row: Vec<f64> = e[from * d..(from + 1) * d].to_vec();
            e[to * d..(to + 1) * d].copy_from_slice(&row);
        }
        for mining in [
            TripletMining::All,
            TripletMining::SemiHard,
            TripletMining::EasyPositiveSemiHardNegative,
        ] {
            for margin in [0.05, 0.3, 1.5] {
                let loss = Triplet {
                    margin,
                    mining,
                    ..Triplet::default()
                };
                for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
                    let [(rv, rg), (kv, kg)] = both(&loss, &labels, &e, d, dtype);
                    let what = format!("{mining:?} m={margin} {dtype:?}");
                    assert!(
                        (rv - kv).abs() <= tol * (1.0 + rv.abs()),
                        "{what}: {kv} vs {rv}"
                    );
                    for (i, (r, k)) in rg.iter().zip(&kg).enumerate() {
                        assert!(
                            (r - k).abs() <= tol * (1.0 + r.abs()),
                            "{what} grad[{i}]: {k} vs {r}"
                        );
                    }
                    if margin == 0.3 {
                        assert!(rv > 0.0, "{what}: the test should have active triplets");
                    }
                }
            }
        }
    }

    #[test]
    fn the_kernels_mine_what_the_row_engine_mines_with_exact_ties() {
        // Distances on a grid of 1/16: many exact ties, and semi-hard windows ending exactly on
        // a grid value (margins of 2 and 4 steps, all exact in binary), which embeddings
        // through a matrix product never give.
        let b = 17;
        let ids: Vec<u32> = (0..b as u32).map(|i| i % 4).collect();
        let mut s = 11u64;
        let x: Vec<f64> = (0..b * b)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) % 9) as f64 * 0.0625 - 0.25
            })
            .collect();
        for mining in [
            TripletMining::All,
            TripletMining::SemiHard,
            TripletMining::EasyPositiveSemiHardNegative,
        ] {
            for margin in [0.125, 0.25] {
                let Emulated {
                    counts, partial, ..
                } = emulate(&x, false, &ids, margin, mining, 1.0);
                for a in 0..b {
                    let row = &x[a * b..(a + 1) * b];
                    let pos: Vec<(usize, f64)> = (0..b)
                        .filter(|&j| j != a && ids[j] == ids[a])
                        .map(|j| (j, row[j]))
                        .collect();
                    let neg: Vec<(usize, f64)> = (0..b)
                        .filter(|&j| ids[j] != ids[a])
                        .map(|j| (j, row[j]))
                        .collect();
                    let want = super::super::anchor_triplets(&pos, &neg, margin, mining, true);
                    let mut want_counts = vec![0.0; b];
                    for (col, n) in &want.counts {
                        want_counts[*col] += *n as f64;
                    }
                    let what = format!("{mining:?} m={margin} anchor {a}");
                    assert_eq!(&counts[a * b..(a + 1) * b], &want_counts[..], "{what}");
                    let sum: f64 = partial[a * b..(a + 1) * b].iter().sum();
                    assert!(
                        (sum - want.sum).abs() < 1e-12,
                        "{what}: {sum} vs {}",
                        want.sum
                    );
                }
            }
        }
    }

    #[test]
    fn the_reduction_is_the_mean_active_cost_and_the_gradient_scales_with_g() {
        let b = 12;
        let ids: Vec<u32> = (0..b as u32).map(|i| i % 3).collect();
        let x = crate::kernels::emulation::uniform(b * b, 9);
        for mining in [
            TripletMining::All,
            TripletMining::SemiHard,
            TripletMining::EasyPositiveSemiHardNegative,
        ] {
            let what = format!("{mining:?}");
            let one = emulate(&x, false, &ids, 0.3, mining, 1.0);
            let active: f64 = one.counts.iter().filter(|&&c| c > 0.0).sum();
            assert!(active > 0.0, "{what}: the test should have active triplets");
            assert_eq!(one.divisor, active.max(1.0), "{what}");
            let cost: f64 = one.partial.iter().sum();
            let want = cost / active;
            assert!(
                (one.loss - want).abs() <= 1e-12 * want,
                "{what}: {}",
                one.loss
            );
            for (dx, c) in one.dx.iter().zip(&one.counts) {
                assert_eq!(*dx, c / one.divisor, "{what}");
            }
            let scaled = emulate(&x, false, &ids, 0.3, mining, -0.5);
            for (s, o) in scaled.dx.iter().zip(&one.dx) {
                assert_eq!(*s, -0.5 * o, "{what}");
            }
        }
    }

    #[test]
    fn a_batch_whose_triplets_all_hold_gives_zero_and_no_gradient() {
        // Two tight, far apart classes: with a small margin no triplet costs anything.
        let e = [1.0, 0.0, 0.99, 0.01, 0.0, 1.0, 0.01, 0.99];
        let labels = Labels::from_fine(&[0, 0, 1, 1]).unwrap();
        let loss = Triplet {
            margin: 0.05,
            mining: TripletMining::All,
            ..Triplet::default()
        };
        let [(rv, _), (kv, kg)] = both(&loss, &labels, &e, 2, DType::F64);
        assert_eq!(rv, 0.0);
        assert_eq!(kv, 0.0);
        assert!(kg.iter().all(|&g| g == 0.0));
    }

    #[test]
    fn a_batch_without_candidates_is_the_row_engine_error() {
        let check =
            |fine: &[i64]| super::super::check_candidates(&Labels::from_fine(fine).unwrap());
        for fine in [&[0, 0, 0][..], &[0, 1, 2]] {
            let err = check(fine).unwrap_err().to_string();
            let row = Triplet::default().forward(
                &Tensor::ones((3, 2), DType::F64, &Device::Cpu).unwrap(),
                &Labels::from_fine(fine).unwrap(),
            );
            assert_eq!(err, row.unwrap_err().to_string(), "{fine:?}");
        }
        assert!(check(&[0, 0, 1]).is_ok());
    }

    #[test]
    fn the_device_path_applies_only_on_cuda_with_cosine_and_no_chunk() {
        let x = Tensor::zeros((8, 4), DType::F32, &Device::Cpu).unwrap();
        let labels = Labels::from_fine(&[0, 0, 1, 1, 2, 2, 3, 3]).unwrap();
        assert_eq!(plan(&Triplet::default(), &x, &labels), None);
        assert_eq!(mining_code(TripletMining::SemiHard), 1);
    }

    #[test]
    fn the_class_lists_hold_each_class_in_order_and_the_work_counts_the_positives() {
        let ids = [2, 0, 2, 1, 0, 2, 3];
        let (start, items) = class_lists(&ids);
        assert_eq!(start, [0, 2, 3, 6, 7]);
        assert_eq!(items, [1, 4, 3, 0, 2, 5, 6]);
        // Positives: 1 for each item of class 0, 0 for class 1, 2 for each of class 2, 0 for
        // class 3: 8 (anchor, positive) pairs, each against the 7 items.
        assert_eq!(work(&ids), Some(8 * 7));
        assert_eq!(class_lists(&[]), (vec![0], vec![]));
        assert_eq!(work(&[]), Some(0));
    }
}

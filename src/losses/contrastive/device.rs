//! The contrastive loss on a CUDA device in three launches after the similarity product: one
//! op whose forward pass reduces the `B × B` similarities to the loss and whose backward pass
//! writes their gradient, instead of the plain formulation's two dozen tensor operations.
//!
//! **Why.** At B = 256 the loss is launch-bound: on the H200 (2026-11-26) the plain formulation
//! took 1.01 ms against PyTorch's 1.61 ms (1.6×; the issue asks 3×), spent on the pair masks,
//! two cost maps, two non-zero means and their autograd — each a launch, an allocation and a
//! host-side dispatch. The contrastive loss is also ROADMAP's calibration term and the training
//! benchmarks' loss. Here the kernels of `device.cu` beside this file compute, with the row
//! engine's arithmetic (in `f64`, [`super::pair_cost`]):
//!
//! ```text
//! rows (thread i):      over j ≠ i, the positives' Σ cost, #(cost > 0), #pairs; the negatives' likewise
//! total (one thread):   L = Σ⁺ cost / D⁺ + Σ⁻ cost / D⁻   (D: #(cost > 0), or #pairs for the mean;
//!                                                         a term without a divisor is 0)
//! gradient (i, j):      ∂L/∂s_ij = g · slope_ij / D^kind(i,j)    (0 where the pair costs nothing)
//! ```
//!
//! The divisors stay on the device between the two passes (kept by the op for its backward
//! pass), and the incoming gradient `g` is read there: no value travels to the host. Autograd
//! takes `∂L/∂S` through the product and the normalisation. Both metrics (the cosine and the
//! normalised Euclidean distance, whose slope at a duplicate pair is torch's `cdist`'s 0, as the
//! row engine's) and both reductions. Used while `S` has at most 2²⁹ values (as the plain
//! formulation, B ≈ 23,000); beyond, the row engine.
//!
//! **Tests.** The unit tests compile `device.cu` with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/contrastive.cpp`): the value, divisors and `∂L/∂S` equal
//! to [`super::pair_cost`] summed in the kernels' order, bit for bit, and through autograd the
//! embeddings' gradient equal to the row engine's for both metrics and reductions; the GPU check
//! compares the loss on CUDA with the CPU.

use super::{Contrastive, PairReduction};
use crate::error::Result;
use crate::hierarchy::Labels;
use crate::losses::pairwise_rows::PairMetric;
use crate::losses::{dense_fine_ids, l2_normalize, plain_on_device};
use candle_core::Tensor;

/// Whether `loss` on `embeddings` runs on the device kernels: [`crate::kernels::on_cuda`], no
/// query chunk asked, and the `B × B` similarities within the plain formulations' bound.
pub(super) fn applies(loss: &Contrastive, embeddings: &Tensor) -> bool {
    let Ok(b) = embeddings.dim(0) else {
        return false;
    };
    crate::kernels::on_cuda(embeddings) && plain_on_device(embeddings, loss.query_chunk, b * b)
}

/// The kernels' scalar parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
struct Params {
    pos_margin: f64,
    neg_margin: f64,
    /// 1 for the Euclidean distance, 0 for the cosine similarity.
    euclidean: u32,
    /// 1 for the mean over all pairs of a kind, 0 for the mean over the non-zero costs.
    mean: u32,
}

impl Params {
    fn of(loss: &Contrastive) -> Params {
        Params {
            pos_margin: loss.pos_margin,
            neg_margin: loss.neg_margin,
            euclidean: u32::from(loss.metric == PairMetric::Euclidean),
            mean: u32::from(loss.reduction == PairReduction::Mean),
        }
    }
}

/// The contrastive loss with its pairs reduced on the device (see the module documentation).
pub(super) fn forward(loss: &Contrastive, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
    let x = l2_normalize(embeddings, "embeddings")?;
    let s = x.matmul(&x.t()?)?;
    pair_loss(&s, dense_fine_ids(labels), Params::of(loss))
}

#[cfg(feature = "cuda")]
fn pair_loss(s: &Tensor, ids: Vec<u32>, params: Params) -> Result<Tensor> {
    let loss = cuda::PairCosts { ids, params };
    Ok(crate::kernels::loss_op::apply(s, loss)?)
}

#[cfg(not(feature = "cuda"))]
fn pair_loss(_: &Tensor, _: Vec<u32>, _: Params) -> Result<Tensor> {
    Err(crate::error::Error::invalid(
        "device",
        "the contrastive loss's kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::Params;
    use crate::kernels::loss_op::KernelLoss;
    use crate::kernels::{instance, per_entry, per_row, ptx, Float};
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::Layout;
    use std::sync::Arc;

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_contrastive";

    /// The contrastive loss of the `B × B` similarities `S`.
    pub(super) struct PairCosts {
        pub(super) ids: Vec<u32>,
        pub(super) params: Params,
    }

    /// What the forward pass leaves on the device for the backward pass: the class ids and
    /// the two divisors.
    #[derive(Clone)]
    pub(super) struct Saved {
        cls: Arc<CudaSlice<u32>>,
        divisors: Arc<CudaSlice<f64>>,
    }

    impl KernelLoss for PairCosts {
        type Saved = Saved;
        const NAME: &'static str = "rankwise-contrastive-pairs";
        const GRAD_NAME: &'static str = "rankwise-contrastive-pairs-grad";

        fn dims(&self, _: &Layout) -> (usize, usize) {
            (self.ids.len(), self.ids.len())
        }

        fn forward<T: Float>(
            &self,
            dev: &CudaDevice,
            s: &CudaView<T>,
            (b, _): (usize, usize),
        ) -> candle_core::Result<(CudaSlice<T>, Saved)> {
            let nb = b as u64;
            let p = self.params;
            let cls = dev.clone_htod(&self.ids)?;
            // SAFETY (the three allocations): the row kernel writes all 6 B partials, the total
            // kernel the loss and both divisors, before anything reads them.
            let mut partial = unsafe { dev.alloc::<f64>(6 * b)? };
            let mut loss = unsafe { dev.alloc::<T>(1)? };
            let mut divisors = unsafe { dev.alloc::<f64>(2)? };
            let func = |name: &str| {
                dev.get_or_load_custom_func(&instance::<T>(name), MODULE, ptx(MODULE, SOURCE)?)
            };
            let rows = func("rankwise_pair_rows")?;
            let mut l = rows.builder();
            l.arg(s)
                .arg(&cls)
                .arg(&mut partial)
                .arg(&nb)
                .arg(&p.pos_margin)
                .arg(&p.neg_margin)
                .arg(&p.euclidean);
            // SAFETY: `s` holds B × B values (checked by the op), `cls` B, `partial` 6 B.
            unsafe { l.launch(per_row(b)) }.w()?;
            let total = func("rankwise_pair_total")?;
            let mut l = total.builder();
            l.arg(&partial)
                .arg(&mut loss)
                .arg(&mut divisors)
                .arg(&nb)
                .arg(&p.mean);
            // SAFETY: one thread reads the 6 B partials and writes one loss and two divisors.
            unsafe { l.launch(per_row(1)) }.w()?;
            let saved = Saved {
                cls: Arc::new(cls),
                divisors: Arc::new(divisors),
            };
            Ok((loss, saved))
        }

        fn backward<T: Float>(
            &self,
            dev: &CudaDevice,
            s: &CudaView<T>,
            g: &CudaView<T>,
            saved: &Saved,
            (b, _): (usize, usize),
        ) -> candle_core::Result<CudaSlice<T>> {
            let nb = b as u64;
            let p = self.params;
            // SAFETY: the kernel writes every one of the B × B values.
            let mut ds = unsafe { dev.alloc::<T>(b * b)? };
            let grad = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_pair_grad"),
                MODULE,
                ptx(MODULE, SOURCE)?,
            )?;
            let mut l = grad.builder();
            l.arg(s)
                .arg(saved.cls.as_ref())
                .arg(saved.divisors.as_ref())
                .arg(g)
                .arg(&mut ds)
                .arg(&nb)
                .arg(&p.pos_margin)
                .arg(&p.neg_margin)
                .arg(&p.euclidean);
            // SAFETY: `s` and `ds` hold B × B values, `cls` B, the divisors 2, `g` one.
            unsafe { l.launch(per_entry(b, b)) }.w()?;
            Ok(ds)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::contrastive::pair_cost;
    use crate::losses::{value_and_grad, RankLoss};
    use candle_core::{DType, Device};

    /// What the harness returns: the loss, the two divisors, `∂L/∂S`.
    struct Emulated {
        loss: f64,
        divisors: [f64; 2],
        ds: Vec<f64>,
    }

    /// The kernels of `device.cu` run on the host by the harness (scrambled thread orders).
    fn emulate(s: &[f64], f32_s: bool, ids: &[u32], p: Params, g: f64) -> Emulated {
        let b = ids.len();
        let mut input = Vec::new();
        for v in [b as u32, u32::from(f32_s), p.euclidean, p.mean] {
            input.extend(v.to_le_bytes());
        }
        input.extend(p.pos_margin.to_le_bytes());
        input.extend(p.neg_margin.to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, s, f32_s);
        for &c in ids {
            input.extend(c.to_le_bytes());
        }
        crate::kernels::emulation::push_values(&mut input, &[g], f32_s);
        let out = crate::kernels::emulation::run("contrastive", &input);
        assert_eq!(out.len(), 3 + b * b);
        Emulated {
            loss: out[0],
            divisors: [out[1], out[2]],
            ds: out[3..].to_vec(),
        }
    }

    fn metric(p: Params) -> PairMetric {
        if p.euclidean == 1 {
            PairMetric::Euclidean
        } else {
            PairMetric::Cosine
        }
    }

    /// [`pair_cost`] summed as the kernels sum (each row's pairs in order, in `f64`, then the
    /// rows in order): the loss, the divisors and `∂L/∂S` for the incoming gradient `g`.
    fn reference(s: &[f64], ids: &[u32], p: Params, g: f64) -> Emulated {
        let b = ids.len();
        let cost = |i: usize, j: usize| {
            pair_cost(
                metric(p),
                s[i * b + j],
                ids[i] == ids[j],
                p.pos_margin,
                p.neg_margin,
            )
        };
        let mut sums = [0.0f64; 6];
        for i in 0..b {
            let mut row = [0.0f64; 6];
            for j in (0..b).filter(|&j| j != i) {
                let (c, _) = cost(i, j);
                let k = if ids[i] == ids[j] { 0 } else { 3 };
                row[k + 2] += 1.0;
                if c > 0.0 {
                    row[k] += c;
                    row[k + 1] += 1.0;
                }
            }
            for k in 0..6 {
                sums[k] += row[k];
            }
        }
        let (dp, dn) = if p.mean == 1 {
            (sums[2], sums[5])
        } else {
            (sums[1], sums[4])
        };
        let term = |sum: f64, d: f64| if d > 0.0 { sum / d } else { 0.0 };
        let mut ds = vec![0.0; b * b];
        for i in 0..b {
            for j in (0..b).filter(|&j| j != i) {
                let (_, slope) = cost(i, j);
                if slope != 0.0 {
                    let d = if ids[i] == ids[j] { dp } else { dn };
                    ds[i * b + j] = g * slope / d;
                }
            }
        }
        Emulated {
            loss: term(sums[0], dp) + term(sums[3], dn),
            divisors: [dp, dn],
            ds,
        }
    }

    fn every_params(pos_margin: f64, neg_margin: f64) -> Vec<Params> {
        let mut v = Vec::new();
        for euclidean in [0, 1] {
            for mean in [0, 1] {
                v.push(Params {
                    pos_margin,
                    neg_margin,
                    euclidean,
                    mean,
                });
            }
        }
        v
    }

    /// Similarities on a grid of 1/8 in [−1, 1] (exact ties, costs exactly 0 at the margins,
    /// duplicates at s = 1: Euclidean distance 0) and one NaN: the kernels' sums, divisors and
    /// `∂L/∂S` are [`pair_cost`]'s in their order, bit for bit in `f64`; in `f32` the same
    /// from the `f32` similarities, rounded once.
    #[test]
    fn the_kernels_sum_pair_cost_in_order() {
        let b = 13;
        let ids: Vec<u32> = (0..b as u32).map(|i| (i * 5) % 4).collect();
        let mut state = 3u64;
        let mut s: Vec<f64> = (0..b * b)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % 17) as f64 * 0.125 - 1.0
            })
            .collect();
        s[2 * b + 9] = f64::NAN;
        for p in every_params(0.5, 0.25)
            .into_iter()
            .chain(every_params(0.0, 1.0))
        {
            for (f32_s, g) in [(false, 1.0), (false, -0.75), (true, 0.5)] {
                let got = emulate(&s, f32_s, &ids, p, g);
                let want = reference(&s, &ids, p, g);
                let round = |v: f64| if f32_s { f64::from(v as f32) } else { v };
                let what = format!("{p:?} f32 {f32_s} g {g}");
                assert_eq!(got.loss, round(want.loss), "{what}");
                assert_eq!(got.divisors, want.divisors, "{what}");
                let want_ds: Vec<f64> = want.ds.iter().map(|&v| round(v)).collect();
                assert_eq!(got.ds, want_ds, "{what}");
                assert!(want.loss > 0.0, "{what}: the test should have costly pairs");
            }
        }
    }

    /// A batch without positive pairs (every class once), and one whose pairs all hold: the
    /// absent or zero term is 0 with no gradient, as in the row engine.
    #[test]
    fn an_absent_or_satisfied_term_is_zero() {
        let s = [
            1.0, 0.1, 0.2, 0.3, 0.1, 1.0, 0.0, -0.5, 0.2, 0.0, 1.0, 0.4, 0.3, -0.5, 0.4, 1.0,
        ];
        let p = Params {
            pos_margin: 0.9,
            neg_margin: 0.6,
            euclidean: 0,
            mean: 0,
        };
        let got = emulate(&s, false, &[0, 1, 2, 3], p, 1.0);
        assert_eq!((got.loss, got.divisors), (0.0, [0.0, 0.0]));
        assert!(got.ds.iter().all(|&v| v == 0.0));
        let mean = Params { mean: 1, ..p };
        let got = emulate(&s, false, &[0, 1, 2, 3], mean, 1.0);
        assert_eq!((got.loss, got.divisors), (0.0, [0.0, 12.0]));
    }

    /// Through autograd from `∂L/∂S` (what the op's backward pass returns), the embeddings'
    /// gradient and the value equal the row engine's (the CPU's path), for both metrics and
    /// reductions, in `f64` and `f32`, with an exact duplicate (Euclidean distance 0).
    #[test]
    fn through_autograd_the_kernels_equal_the_row_engine() {
        let (b, d) = (23, 5);
        let fine: Vec<i64> = (0..b as i64).map(|i| (i * 7) % 5).collect();
        let labels = Labels::from_fine(&fine).unwrap();
        let mut e = crate::kernels::emulation::uniform(b * d, 17);
        let dup: Vec<f64> = e[3 * d..4 * d].to_vec();
        e[8 * d..9 * d].copy_from_slice(&dup); // items 3 and 8 share class 1
        for p in every_params(0.9, 0.6)
            .into_iter()
            .chain(every_params(0.1, 1.1))
        {
            let loss = Contrastive {
                pos_margin: p.pos_margin,
                neg_margin: p.neg_margin,
                metric: metric(p),
                reduction: if p.mean == 1 {
                    PairReduction::Mean
                } else {
                    PairReduction::AvgNonZero
                },
                query_chunk: None,
            };
            assert_eq!(Params::of(&loss), p);
            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
                let x = Tensor::from_vec(e.clone(), (b, d), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let (row_value, row_grad) =
                    value_and_grad(|x: &Tensor| loss.forward(x, &labels), &x);
                // The kernels' ∂L/∂S at these embeddings, then through autograd from S.
                let similarities = |x: &Tensor| -> Result<Tensor> {
                    let n = l2_normalize(x, "embeddings")?;
                    Ok(n.matmul(&n.t()?)?)
                };
                let sv: Vec<f64> = similarities(&x)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let got = emulate(&sv, dtype == DType::F32, &dense_fine_ids(&labels), p, 1.0);
                let ds = Tensor::from_vec(got.ds, (b, b), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let (_, kernel_grad) =
                    value_and_grad(|x: &Tensor| Ok((similarities(x)? * &ds)?.sum_all()?), &x);
                let what = format!("{p:?} {dtype:?}");
                assert!(
                    (got.loss - row_value).abs() <= tol * (1.0 + row_value.abs()),
                    "{what}: {} vs {row_value}",
                    got.loss
                );
                assert!(row_value > 0.0, "{what}");
                for (i, (k, r)) in kernel_grad
                    .iter()
                    .flatten()
                    .zip(row_grad.iter().flatten())
                    .enumerate()
                {
                    assert!(
                        (k - r).abs() <= tol * (1.0 + r.abs()),
                        "{what} grad[{i}]: {k} vs {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_device_path_applies_only_on_cuda_without_a_chunk() {
        let x = Tensor::zeros((8, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(!applies(&Contrastive::default(), &x));
        let e = forward(
            &Contrastive::default(),
            &Tensor::ones((2, 2), DType::F32, &Device::Cpu).unwrap(),
            &Labels::from_fine(&[0, 1]).unwrap(),
        );
        // Without the feature, the build says so; with it, the op is not for the CPU.
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("`cuda` feature") || e.contains("runs on a CUDA device"),
            "{e}"
        );
    }
}

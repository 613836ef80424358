//! FastAP on a CUDA device at any batch size: histograms, values and gradient by kernels of its
//! own, with no host pass and no `B × B × (L + 1)` tensor.
//!
//! On a device FastAP ran its plain tensor formulation (a `B × B × (L + 1)` soft histogram,
//! differentiated by autograd) while that tensor had at most 2²⁹ values — B ≈ 7,000 with 10
//! bins — and the row engine's host pass beyond (B = 16,384: 4.4 s on the H200, PyTorch
//! 149 ms, 2026-11-26). Here the kernels of `device.cu` beside this file compute the module
//! documentation's formulas with the row engine's arithmetic:
//!
//! ```text
//! rows (thread q):      h⁺_l, h⁻_l over the items j ≠ q (each d = 2 − 2 s_qj in its window of bins),
//!                       FastAP_q = (1/N⁺) Σ_l h⁺_l H⁺_l / H_l, and ∂FastAP_q/∂h⁺_l, ∂FastAP_q/∂h⁻_l
//! gradient (q, j):      ∂L/∂s_qj = scale · Σ_l ∂FastAP_q/∂h^±_l · ∂δ(d_qj, z_l)/∂d
//!                       (scale = 2/N_valid for the exact gradient, 1 for the authors' port)
//! loss = 1 − Σ_q FastAP_q / N_valid
//! ```
//!
//! `O(B)` work per query for the histograms, `O(L)` per pair for the gradient, `O(B · L)`
//! scratch memory. One more thread totals the queries into the loss. The gradient is linear in
//! the incoming one (both gradients are), so the op's backward pass is one kernel `∂s = g J`,
//! from `J` kept on the device, and autograd carries it through the product and the
//! normalisation.
//!
//! **Tests.** The unit tests compile `device.cu` with the host's C++ compiler under an emulated
//! launch grid (`tests/cuda_emulation/fastap.cpp`) and compare it with the row engine: through
//! embeddings (the kernels' value and `∂s`, taken through autograd; both gradients, normalised
//! or given unit rows, several bin counts) and on similarities that put distances exactly on bin
//! centres and edges, where the kernel's derivative has its special cases.

use super::{Bins, FastAp, FastApGradient};
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::pairwise_rows::check_unit_rows;
use crate::losses::{check_batch, dense_fine_ids, l2_normalize, LossRecipe};
use candle_core::Tensor;

/// Largest batch sent to the kernels (their sizes are 32-bit; far beyond any batch that fits).
pub const MAX_BATCH: usize = 1 << 20;

/// Whether `loss` on `embeddings` runs on the device kernels: [`crate::kernels::on_cuda`], no
/// query chunk asked, `B ≤` [`MAX_BATCH`].
pub(super) fn applies(loss: &FastAp, embeddings: &Tensor) -> bool {
    let Ok(b) = embeddings.dim(0) else {
        return false;
    };
    loss.query_chunk.is_none() && b <= MAX_BATCH && crate::kernels::on_cuda(embeddings)
}

/// The kernels' parameters (`struct rw_bins` of `device.cu`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Params {
    b: u32,
    nb: u32,
    delta: f64,
    inv_delta: f64,
    port: i32,
    scale: f64,
}

/// The number of queries with a positive (the row engine's `N_valid`), from the labels; the row
/// engine's error when there is none.
fn valid_queries(ids: &[u32]) -> Result<usize> {
    let mut sizes = std::collections::HashMap::new();
    for c in ids {
        *sizes.entry(*c).or_insert(0usize) += 1;
    }
    let valid = ids.iter().filter(|c| sizes[c] >= 2).count();
    if valid == 0 {
        return Err(Error::invalid(
            "labels",
            "FastAP is undefined for this batch: no item shares its class with another \
             item (every query lacks a positive)",
        ));
    }
    Ok(valid)
}

#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
fn params(loss: &FastAp, bins: &Bins, b: usize, valid: usize) -> Params {
    Params {
        b: b as u32,
        nb: bins.len() as u32,
        delta: bins.delta,
        inv_delta: bins.inv_delta,
        port: i32::from(loss.gradient == FastApGradient::AuthorsPort),
        scale: match loss.gradient {
            FastApGradient::Exact => 2.0 / valid as f64,
            FastApGradient::AuthorsPort => 1.0,
        },
    }
}

/// FastAP on the device (see the module documentation).
pub(super) fn forward(loss: &FastAp, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
    check_batch(embeddings, labels)?;
    LossRecipe::validate(loss)?;
    let bins = Bins::new(loss.num_bins)?;
    let x = if loss.normalize {
        l2_normalize(embeddings, "embeddings")?
    } else {
        check_unit_rows(embeddings, 1e-4)?;
        embeddings.clone()
    };
    let s = x.matmul(&x.t()?)?;
    let ids = dense_fine_ids(labels);
    let valid = valid_queries(&ids)?;
    run(loss, &bins, &s, ids, valid)
}

#[cfg(feature = "cuda")]
fn run(loss: &FastAp, bins: &Bins, s: &Tensor, ids: Vec<u32>, valid: usize) -> Result<Tensor> {
    let b = ids.len();
    let loss = cuda::FastApOp {
        params: params(loss, bins, b, valid),
        centres: bins.centres.clone(),
        ids,
        valid,
    };
    Ok(crate::kernels::loss_op::apply(s, loss)?)
}

#[cfg(not(feature = "cuda"))]
fn run(_: &FastAp, _: &Bins, _: &Tensor, _: Vec<u32>, _: usize) -> Result<Tensor> {
    Err(Error::invalid(
        "device",
        "the FastAP kernels need a build with the `cuda` feature",
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::Params;
    use crate::kernels::loss_op::KernelLoss;
    use crate::kernels::{instance, per_entry, per_row, ptx, Float};
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::Layout;
    use std::sync::Arc;

    const SOURCE: &str = include_str!("device.cu");
    const MODULE: &str = "rankwise_fastap";

    // SAFETY: `Params` is `repr(C)` plain data with the layout of `struct rw_bins`.
    unsafe impl DeviceRepr for Params {}

    /// FastAP of the `B × B` similarities `s`; the backward pass is `g J` from `J = ∂L/∂s`
    /// (`B × B`, `f64`) kept on the device.
    pub(super) struct FastApOp {
        pub(super) params: Params,
        pub(super) centres: Vec<f64>,
        pub(super) ids: Vec<u32>,
        pub(super) valid: usize,
    }

    impl KernelLoss for FastApOp {
        type Saved = Arc<CudaSlice<f64>>;
        const NAME: &'static str = "rankwise-fastap";
        const GRAD_NAME: &'static str = "rankwise-fastap-grad";

        fn dims(&self, _: &Layout) -> (usize, usize) {
            (self.ids.len(), self.ids.len())
        }

        fn forward<T: Float>(
            &self,
            dev: &CudaDevice,
            s: &CudaView<T>,
            (b, _): (usize, usize),
        ) -> candle_core::Result<(CudaSlice<T>, Self::Saved)> {
            let cls = dev.clone_htod(&self.ids)?;
            let centres = dev.clone_htod(&self.centres)?;
            let mut scratch = dev.alloc_zeros::<f64>(2 * b * self.centres.len())?;
            let mut fastap = dev.alloc_zeros::<f64>(b)?;
            let mut jac = dev.alloc_zeros::<f64>(b * b)?;
            // SAFETY: the total kernel writes the loss before anything reads it.
            let mut loss = unsafe { dev.alloc::<T>(1)? };
            let module = ptx(MODULE, SOURCE)?;
            let func =
                |name: &str| dev.get_or_load_custom_func(&instance::<T>(name), MODULE, module);
            let rows = func("rankwise_fastap_rows")?;
            let mut l = rows.builder();
            l.arg(s)
                .arg(&cls)
                .arg(&centres)
                .arg(&self.params)
                .arg(&mut scratch)
                .arg(&mut fastap);
            // SAFETY: `s` holds `B × B` values, `cls` `B`, `centres` `L + 1`, `scratch`
            // `2 B (L + 1)`, `fastap` `B`.
            unsafe { l.launch(per_row(b)) }.w()?;
            let grad = func("rankwise_fastap_grad")?;
            let mut l = grad.builder();
            l.arg(s)
                .arg(&cls)
                .arg(&centres)
                .arg(&self.params)
                .arg(&scratch)
                .arg(&mut jac);
            // SAFETY: as above; `jac` holds `B × B` values.
            unsafe { l.launch(per_entry(b, b)) }.w()?;
            let total = func("rankwise_fastap_total")?;
            let (nb, valid) = (b as u32, self.valid as f64);
            let mut l = total.builder();
            l.arg(&fastap).arg(&nb).arg(&valid).arg(&mut loss);
            // SAFETY: one thread reads the `B` values and writes the loss.
            unsafe { l.launch(per_row(1)) }.w()?;
            Ok((loss, Arc::new(jac)))
        }

        fn backward<T: Float>(
            &self,
            dev: &CudaDevice,
            _: &CudaView<T>,
            g: &CudaView<T>,
            jac: &Self::Saved,
            (b, _): (usize, usize),
        ) -> candle_core::Result<CudaSlice<T>> {
            let nb = b as u32;
            // SAFETY: the kernel writes every one of the B × B values.
            let mut ds = unsafe { dev.alloc::<T>(b * b)? };
            let f = dev.get_or_load_custom_func(
                &instance::<T>("rankwise_fastap_chain"),
                MODULE,
                ptx(MODULE, SOURCE)?,
            )?;
            let mut l = f.builder();
            l.arg(jac.as_ref()).arg(g).arg(&mut ds).arg(&nb);
            // SAFETY: `jac` and `ds` hold B × B values, `g` one.
            unsafe { l.launch(per_entry(b, b)) }.w()?;
            Ok(ds)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::pairwise_rows::RowLoss;
    use crate::losses::RankLoss;
    use candle_core::{DType, Device, Var};

    /// What the harness returns: FastAP per query, `J = ∂L/∂s`, the loss, and the backward
    /// pass `g J` for the incoming gradient.
    struct Emulated {
        fastap: Vec<f64>,
        jac: Vec<f64>,
        loss: f64,
        ds: Vec<f64>,
    }

    /// The kernels of `device.cu` run on the host by the harness (blocks of 3 threads).
    fn emulate(
        s: &[f64],
        f32_s: bool,
        ids: &[u32],
        centres: &[f64],
        (p, valid): (Params, usize),
        g: f64,
    ) -> Emulated {
        let b = ids.len();
        let mut input = Vec::new();
        input.extend((b as u32).to_le_bytes());
        input.extend(u32::from(f32_s).to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, s, f32_s);
        for &c in ids {
            input.extend(c.to_le_bytes());
        }
        for &z in centres {
            input.extend(z.to_le_bytes());
        }
        input.extend(p.b.to_le_bytes());
        input.extend(p.nb.to_le_bytes());
        input.extend(p.delta.to_le_bytes());
        input.extend(p.inv_delta.to_le_bytes());
        input.extend(p.port.to_le_bytes());
        input.extend(p.scale.to_le_bytes());
        input.extend((valid as f64).to_le_bytes());
        crate::kernels::emulation::push_values(&mut input, &[g], f32_s);
        let out = crate::kernels::emulation::run("fastap", &input);
        let bb = b * b;
        assert_eq!(out.len(), b + 2 * bb + 1);
        Emulated {
            fastap: out[..b].to_vec(),
            jac: out[b..b + bb].to_vec(),
            loss: out[b + bb],
            ds: out[b + bb + 1..].to_vec(),
        }
    }

    #[test]
    fn the_kernels_equal_the_row_engine_through_embeddings() {
        let (b, d) = (23, 4);
        let mut fine: Vec<i64> = (0..b as i64).map(|i| i % 4).collect();
        fine[22] = 7; // a query without positive
        let labels = Labels::from_fine(&fine).unwrap();
        let mut e = crate::kernels::emulation::uniform(b * d, 8);
        for (from, to) in [(0, 4), (1, 5)] {
            let row: Vec<f64> = e[from * d..(from + 1) * d].to_vec();
            e[to * d..(to + 1) * d].copy_from_slice(&row);
        }
        let raw = Tensor::from_vec(e, (b, d), &Device::Cpu).unwrap();
        let unit = l2_normalize(&raw, "e").unwrap();
        for num_bins in [1, 10, 25] {
            for gradient in [FastApGradient::Exact, FastApGradient::AuthorsPort] {
                for normalize in [true, false] {
                    let loss = FastAp {
                        num_bins,
                        gradient,
                        normalize,
                        query_chunk: None,
                    };
                    let base = if normalize { &raw } else { &unit };
                    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
                        let var = Var::from_tensor(&base.to_dtype(dtype).unwrap()).unwrap();
                        let grads = |l: &Tensor| -> (f64, Vec<f64>) {
                            let g = l.backward().unwrap();
                            let g = g.get(var.as_tensor()).unwrap();
                            (
                                l.to_dtype(DType::F64).unwrap().to_scalar().unwrap(),
                                g.to_dtype(DType::F64)
                                    .unwrap()
                                    .flatten_all()
                                    .unwrap()
                                    .to_vec1()
                                    .unwrap(),
                            )
                        };
                        let (rv, rg) = grads(&loss.forward(var.as_tensor(), &labels).unwrap());
                        let x = if normalize {
                            l2_normalize(var.as_tensor(), "e").unwrap()
                        } else {
                            var.as_tensor().clone()
                        };
                        let s = x.matmul(&x.t().unwrap()).unwrap();
                        let flat: Vec<f64> = s
                            .to_dtype(DType::F64)
                            .unwrap()
                            .flatten_all()
                            .unwrap()
                            .to_vec1()
                            .unwrap();
                        let ids = dense_fine_ids(&labels);
                        let valid = valid_queries(&ids).unwrap();
                        let bins = Bins::new(num_bins).unwrap();
                        let p = params(&loss, &bins, b, valid);
                        let k = emulate(
                            &flat,
                            dtype == DType::F32,
                            &ids,
                            &bins.centres,
                            (p, valid),
                            1.0,
                        );
                        let attached = crate::kernels::emulation::attach_loss(&s, k.loss, k.ds);
                        let (kv, kg) = grads(&attached);
                        let what =
                            format!("{num_bins} bins {gradient:?} normalize={normalize} {dtype:?}");
                        assert!(
                            (rv - kv).abs() <= tol * (1.0 + rv.abs()),
                            "{what}: {kv} vs {rv}"
                        );
                        assert!(rg.iter().any(|&g| g != 0.0), "{what}: no gradient");
                        for (i, (r, k)) in rg.iter().zip(&kg).enumerate() {
                            assert!(
                                (r - k).abs() <= tol * (1.0 + r.abs()),
                                "{what} grad[{i}]: {k} vs {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_kernels_equal_the_row_engine_on_bin_centres_and_edges() {
        // s = k/8 gives d = 2 − k/4: with 16 bins (Δ = 1/4) every distance is a bin centre, and
        // with 8 bins (Δ = 1/2) every other one is an edge of a kernel's support.
        let b = 12;
        let ids: Vec<u32> = (0..b as u32).map(|i| i % 3).collect();
        let fine: Vec<i64> = ids.iter().map(|&c| i64::from(c)).collect();
        let mut x = 5u64;
        let sims: Vec<f64> = (0..b * b)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % 17) as f64 / 8.0 - 1.0
            })
            .collect();
        for num_bins in [8, 16] {
            for gradient in [FastApGradient::Exact, FastApGradient::AuthorsPort] {
                let loss = FastAp {
                    num_bins,
                    gradient,
                    ..FastAp::default()
                };
                let bins = Bins::new(num_bins).unwrap();
                let valid = valid_queries(&ids).unwrap();
                let k = emulate(
                    &sims,
                    false,
                    &ids,
                    &bins.centres,
                    (params(&loss, &bins, b, valid), valid),
                    -0.5,
                );
                let (f, j) = (&k.fastap, &k.jac);
                // The loss totals the queries in order; the backward pass scales J by g.
                let want = 1.0 - f.iter().sum::<f64>() / valid as f64;
                assert_eq!(k.loss, want, "{num_bins} bins {gradient:?}");
                for (d, jj) in k.ds.iter().zip(j) {
                    assert_eq!(*d, -0.5 * jj, "{num_bins} bins {gradient:?}");
                }
                let rows = super::super::FastApRows {
                    bins: Bins::new(num_bins).unwrap(),
                    fine: std::sync::Arc::new(fine.clone()),
                    gradient,
                };
                let summaries: Vec<_> = (0..b)
                    .map(|q| rows.summarise(q, &sims[q * b..(q + 1) * b]))
                    .collect();
                let global = rows.global(&summaries).unwrap();
                for q in 0..b {
                    let what = format!("{num_bins} bins {gradient:?} query {q}");
                    let want = summaries[q].as_ref().map_or(0.0, |r| r.fastap);
                    assert_eq!(f[q], want, "{what}");
                    let mut out = vec![0.0; b];
                    let row = &sims[q * b..(q + 1) * b];
                    rows.row_grad(q, row, &summaries[q], &global, 1.0, &mut out);
                    assert_eq!(&j[q * b..(q + 1) * b], &out[..], "{what}");
                }
            }
        }
    }

    #[test]
    fn a_batch_without_positive_is_the_row_engine_error() {
        let err = valid_queries(&[0, 1, 2]).unwrap_err();
        assert!(
            err.to_string().contains("every query lacks a positive"),
            "{err}"
        );
        assert_eq!(valid_queries(&[0, 1, 0]).unwrap(), 2);
        let x = Tensor::zeros((8, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(!applies(&FastAp::default(), &x));
        assert_eq!(std::mem::size_of::<Params>(), 40);
    }
}

//! Batches larger than memory allows, with the exact gradient: the "memory-efficient
//! backpropagation" of Revaud et al. (2019) used by FastAP's `train_staged` (MATLAB) and
//! SupRank's `engine/large_batch_update.py`.
//!
//! A rank loss couples every item of the batch, so the batch cannot be split into independent
//! mini-batches. But its gradient factors through the embedding matrix `E` (`B × D`):
//! `∂L/∂θ = Σ_i (∂L/∂e_i) · ∂e_i/∂θ`. So:
//! 1. embed the batch chunk by chunk *without* a graph (memory: one chunk of activations);
//! 2. compute the loss on `E` and its gradient `G = ∂L/∂E` (memory: the loss's own working set);
//! 3. re-embed each chunk *with* a graph and back-propagate the scalar `Σ (E_chunk ⊙ G_chunk)`,
//!    whose gradient with respect to θ is that chunk's share of `∂L/∂θ`; sum over the chunks.
//!
//! The result equals the direct gradient up to floating-point summation order, provided the
//! forward pass of a chunk does not depend on the rest of the batch: BatchNorm must be frozen
//! (the trainer refuses chunking with batch statistics, which would differ per chunk).

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::{guard, RankLoss};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

/// The loss value and the gradients of every variable that reaches it, for one batch, computed
/// directly (one forward pass with a graph over the whole batch).
pub fn direct_gradients(
    forward: &dyn Fn(&Tensor) -> Result<Tensor>,
    images: &Tensor,
    labels: &Labels,
    loss: &dyn RankLoss,
) -> Result<(f64, GradStore)> {
    let embeddings = forward(images)?;
    // The loss's input checks are decided on the device (`losses::guard`): the step then
    // reads nothing back before the value below.
    let value = guard::deferred(|| loss.forward(&embeddings, labels))?;
    check_scalar(&value)?;
    // The backward pass is queued before the value is read: on a device, reading it waits for
    // the device to finish, and the host would then launch the whole backward pass onto an
    // idle GPU instead of while it still runs the forward pass.
    let grads = value.backward()?;
    Ok((checked_value(&value, loss, &embeddings, labels)?, grads))
}

/// The same loss value and gradients as [`direct_gradients`], computed with at most `chunk`
/// images in a graph at a time (the three steps of the module documentation).
///
/// Gradients of variables used by the loss itself (proxies, …) are included.
pub fn chunked_gradients(
    forward: &dyn Fn(&Tensor) -> Result<Tensor>,
    images: &Tensor,
    labels: &Labels,
    loss: &dyn RankLoss,
    chunk: usize,
) -> Result<(f64, GradStore)> {
    if chunk == 0 {
        return Err(Error::invalid("large_batch_chunk", "must be ≥ 1"));
    }
    let b = images.dim(0)?;
    let starts: Vec<usize> = (0..b).step_by(chunk).collect();
    // Step 1: embeddings without a graph.
    let parts = starts
        .iter()
        .map(|&s| Ok(forward(&images.narrow(0, s, chunk.min(b - s))?)?.detach()))
        .collect::<Result<Vec<_>>>()?;
    let embeddings = Var::from_tensor(&Tensor::cat(&parts, 0)?)?;
    // Step 2: the loss and its gradient with respect to the embedding matrix.
    let value = guard::deferred(|| loss.forward(embeddings.as_tensor(), labels))?;
    check_scalar(&value)?;
    let mut grads = value.backward()?;
    let grad_e = grads
        .remove(embeddings.as_tensor())
        .ok_or_else(|| Error::invalid("loss", "the loss does not depend on the embeddings"))?;
    // Step 3: re-run each chunk with a graph and inject its slice of the gradient.
    for &s in &starts {
        let n = chunk.min(b - s);
        let e = forward(&images.narrow(0, s, n)?)?;
        let g = grad_e.narrow(0, s, n)?.detach();
        let surrogate = (e * g)?.sum_all()?;
        grads.extend(surrogate.backward()?)?;
    }
    // Read last, for the reason given in `direct_gradients`.
    let v = checked_value(&value, loss, embeddings.as_tensor(), labels)?;
    Ok((v, grads))
}

/// The value of a loss computed under [`guard::deferred`]; when it is not finite, the batch's
/// checks made on the host name a bad row (an error), if there is one.
fn checked_value(
    value: &Tensor,
    loss: &dyn RankLoss,
    embeddings: &Tensor,
    labels: &Labels,
) -> Result<f64> {
    let v = scalar_value(value)?;
    if !v.is_finite() {
        guard::explain(loss, embeddings, labels)?;
    }
    Ok(v)
}

/// Errors if the loss tensor is not a scalar (no read of its value: no wait for a device).
fn check_scalar(value: &Tensor) -> Result<()> {
    if value.elem_count() != 1 {
        return Err(Error::Shape(format!(
            "the loss must be a scalar, got shape {:?}",
            value.dims()
        )));
    }
    Ok(())
}

/// The value of a scalar loss tensor, as `f64`; errors if it is not a scalar.
pub(crate) fn scalar_value(value: &Tensor) -> Result<f64> {
    check_scalar(value)?;
    Ok(value
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::contrastive::Contrastive;
    use crate::losses::guard::tests::with_cpu_deferring;
    use candle_core::Device;

    /// A step whose loss checks are deferred (the CPU standing for a device): a good batch
    /// gives the same value and gradient as the checks made at once; a bad row is still an
    /// error naming it, found once the value is read, by both gradient paths.
    #[test]
    fn a_deferred_check_that_fails_names_the_row_after_the_value_is_read() {
        let labels = Labels::from_fine(&[0, 0, 1, 1]).unwrap();
        let w = Var::new(&[[1.0f64, 2.0]], &Device::Cpu).unwrap();
        // Embeddings `image_i ⊙ w` (no row depends on another, as chunking requires): a zero
        // (or NaN) image gives a zero (or NaN) row.
        let forward = |x: &Tensor| -> Result<Tensor> { Ok(x.broadcast_mul(w.as_tensor())?) };
        let images = |last: f64| {
            Tensor::new(
                &[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [last, last]],
                &Device::Cpu,
            )
        };
        // The plain formulation (the one a CUDA device runs): on the CPU the row engine would
        // check the norms itself, at once.
        struct Plain(Contrastive);
        impl RankLoss for Plain {
            fn forward(&self, e: &Tensor, labels: &Labels) -> Result<Tensor> {
                self.0.forward_plain(e, labels)
            }
        }
        let loss = Plain(Contrastive::default());
        let run = |x: &Tensor, chunk: Option<usize>| match chunk {
            None => direct_gradients(&forward, x, &labels, &loss),
            Some(c) => chunked_gradients(&forward, x, &labels, &loss, c),
        };
        for chunk in [None, Some(2)] {
            let good = images(0.5).unwrap();
            let (v, g) = run(&good, chunk).unwrap();
            let (dv, dg) = with_cpu_deferring(|| run(&good, chunk)).unwrap();
            assert_eq!(v.to_bits(), dv.to_bits());
            let (a, b) = (g.get(&w).unwrap(), dg.get(&w).unwrap());
            assert_eq!(
                a.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f64>().unwrap()
            );
            for (last, why) in [(0.0, "zero norm"), (f64::NAN, "NaN or infinity")] {
                let bad = images(last).unwrap();
                let at_once = run(&bad, chunk).unwrap_err().to_string();
                let deferred = with_cpu_deferring(|| run(&bad, chunk))
                    .unwrap_err()
                    .to_string();
                assert!(
                    at_once.contains("row 3") && at_once.contains(why),
                    "{at_once}"
                );
                assert_eq!(deferred, at_once, "chunk {chunk:?} last {last}");
            }
        }
    }
}

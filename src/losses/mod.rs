//! Rank losses and the baselines of the papers' tables.
//!
//! Every loss is a plain struct with public, documented hyperparameters whose `Default` is the
//! paper's setting, implementing [`RankLoss`]. Smooth-rank losses are built from the pieces of
//! the authors' unified SupRank code: a step *surrogate* (how `H(s_j − s_k)` is smoothed), a
//! *ranker* (which pairs are smoothed and how ranks are summed) and a per-metric *score*.
//!
//! Memory: pairwise losses work on chunks of queries so the working set is `O(chunk × B)`
//! (or `O(chunk × B × B)` where the formula needs it) instead of `O(B³)`, with values and
//! gradients identical to the unchunked formula.

pub mod blackbox_rank;
pub mod cluster;
pub mod config;
pub mod contrastive;
pub mod csl;
pub mod fastap;
pub mod guard;
pub mod happier;
pub mod norm_softmax;
mod normalize;
pub mod pairwise_rows;
pub mod proxy_nca;
pub mod proxy_nca_pp;
pub mod rambo;
pub mod roadmap;
pub mod smooth_ap;
pub mod smooth_rank;
pub mod summed_levels;
pub mod surrogate;
pub mod triplet;

pub use config::{LossContext, LossRecipe};

// Every loss a recipe can name (`[loss] kind = "<variant in snake_case>"`, then the recipe's
// fields). A new loss: its file (the loss, its recipe with serde and the paper's `Default`,
// `impl LossRecipe`), its `pub mod` above, and one line here.
config::registry! {
    /// Smooth-AP (Brown et al., Eq. 7).
    SmoothAp(smooth_ap::SmoothAp),
    /// FastAP (Cakir et al., histogram AP).
    FastAp(fastap::FastAp),
    /// RaMBO (Rolínek et al.): blackbox-differentiated AP or recall loss.
    Rambo(rambo::RamboConfig),
    /// HAPPIER (Ramzi et al., §3.3): `(1 − λ) L^s_{H-AP} + λ L_clust`.
    Happier(happier::HappierConfig),
    /// ROADMAP / SupAP (Ramzi et al., NeurIPS 2021), a baseline of HAPPIER's tables.
    Roadmap(roadmap::Roadmap),
    /// Contrastive loss with margins on cosine similarities.
    Contrastive(contrastive::Contrastive),
    /// Triplet margin loss with mining (TL_SH of HAPPIER's tables).
    Triplet(triplet::Triplet),
    /// Normalised softmax over learnable class proxies (NSM); with an angular margin, ArcFace.
    NormSoftmax(norm_softmax::NormSoftmaxConfig),
    /// ProxyNCA++ (Teh et al., ECCV 2020): the proxy assignment probability at a low
    /// temperature, the NCA++ baseline of HAPPIER's tables.
    ProxyNcaPp(proxy_nca_pp::ProxyNcaPpConfig),
    /// ProxyNCA (Movshovitz-Attias et al., ICCV 2017, as Roth & Brattoli re-implemented it):
    /// the positive proxy's weight over the other proxies', a baseline of Smooth-AP's and
    /// RaMBO's tables.
    ProxyNca(proxy_nca::ProxyNcaConfig),
    /// The "Σ" hierarchical baselines: the same flat loss at every level, summed.
    Summed(summed_levels::SummedConfig),
    /// CSL (Sun et al., CVPR 2021, as re-implemented by HAPPIER's authors): hierarchical
    /// proxies with a margin per level, a baseline of HAPPIER's tables.
    Csl(csl::CslConfig),
}

impl Default for LossConfig {
    /// Smooth-AP with the paper's τ = 0.01.
    fn default() -> Self {
        LossConfig::SmoothAp(smooth_ap::SmoothAp::default())
    }
}

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use candle_core::{DType, Tensor, Var};

/// A loss over a batch of embeddings and their (hierarchical) labels.
pub trait RankLoss {
    /// Scalar loss for a batch of embeddings (`B × D`) and their labels (`B` rows).
    ///
    /// Each implementation documents whether it L2-normalises the embeddings itself and whether
    /// the query takes part in its own retrieval set (the authors' code includes it; the papers'
    /// formulas do not).
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor>;

    /// The loss's own learnable variables (e.g. the class proxies of HAPPIER's clustering loss
    /// or of the normalised softmax), with names unique within the loss. The trainer gives them
    /// their own parameter group and saves them in checkpoints. Most losses have none.
    fn trainable_vars(&self) -> Vec<(String, Var)> {
        Vec::new()
    }

    /// State that changes as the loss is used and that a checkpoint must keep for a
    /// bit-identical resume (RaMBO's score memory), as JSON. `None` for stateless losses.
    fn state_json(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// Restores what [`RankLoss::state_json`] returned.
    fn load_state_json(&self, _json: &str) -> Result<()> {
        Err(Error::invalid(
            "loss state",
            "this loss keeps no state, but the checkpoint has some: was it trained with another loss?",
        ))
    }
}

/// A borrowed loss is a loss (so a trainer can hold either an owned or a borrowed one).
impl<T: RankLoss + ?Sized> RankLoss for &T {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        (**self).forward(embeddings, labels)
    }

    fn trainable_vars(&self) -> Vec<(String, Var)> {
        (**self).trainable_vars()
    }

    fn state_json(&self) -> Result<Option<String>> {
        (**self).state_json()
    }

    fn load_state_json(&self, json: &str) -> Result<()> {
        (**self).load_state_json(json)
    }
}

/// L2-normalises the rows of `rows` (`B × D`), differentiably — the normalisation of every
/// loss. Errors on a row of zero or non-finite norm, naming `field` and the row, instead of
/// producing NaN (PyTorch's `F.normalize` would silently return a zero vector, making every
/// similarity 0); inside [`guard::deferred`], off the CPU, that check makes the loss value NaN
/// instead of waiting for the device. Models use [`crate::models::layers::l2_normalize`]
/// instead, which clamps the norm like `F.normalize`, because a forward pass must not fail.
pub fn l2_normalize(rows: &Tensor, field: &str) -> Result<Tensor> {
    let norms = rows.sqr()?.sum_keepdim(1)?.sqrt()?;
    guard::valid_norms(rows, &norms, field)?;
    // The division and its whole gradient by one op each (`normalize`: CPU and CUDA), where
    // candle's autograd of the division takes a dozen ops.
    if let Some(unit) = normalize::unit_rows(rows, &norms)? {
        return Ok(unit);
    }
    Ok(rows.broadcast_div(&norms)?)
}

/// Checks that `embeddings` is a finite `B × D` float matrix with one label row per item
/// (inside [`guard::deferred`], off the CPU, the finiteness makes the loss value NaN instead
/// of waiting for the device).
///
/// Shared by every loss so that bad input fails with the same clear message instead of a NaN
/// loss several steps later.
pub fn check_batch(embeddings: &Tensor, labels: &Labels) -> Result<()> {
    let (b, _) = guard::finite_rows(embeddings, "embeddings")?;
    if b != labels.len() {
        return Err(Error::Shape(format!(
            "{b} embeddings but {} label rows",
            labels.len()
        )));
    }
    Ok(())
}

/// `Σ losses / #{losses > 0}` (0 when none is positive): pml's `AvgNonZeroReducer`, the
/// reduction of the calibration, contrastive and triplet losses' tensor formulations. On a
/// device the count stays there (no copy of the `B × B` costs to the host and no wait for it).
pub(crate) fn mean_nonzero(losses: &Tensor) -> Result<Tensor> {
    if !losses.device().is_cpu() {
        return mean_nonzero_in_place(losses);
    }
    let count = losses
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?
        .iter()
        .filter(|v| **v > 0.0)
        .count();
    Ok((losses.sum_all()? / count.max(1) as f64)?)
}

/// [`mean_nonzero`] with the count taken by tensor ops where `losses` lives (the device path;
/// callable on the CPU for tests).
fn mean_nonzero_in_place(losses: &Tensor) -> Result<Tensor> {
    // Counted in f64: an f32 sum of ones is exact only up to 2²⁴ pairs (B ≈ 4096).
    let count = losses
        .gt(0.0)?
        .to_dtype(DType::F64)?
        .sum_all()?
        .maximum(1.0)?
        .to_dtype(losses.dtype())?;
    Ok(losses.sum_all()?.div(&count)?)
}

/// The fine classes of a batch as dense `u32` ids in order of first appearance (the comparison
/// kernels of every device and the CUDA kernels of the losses take `u32`).
pub(crate) fn dense_fine_ids(labels: &Labels) -> Vec<u32> {
    dense_ids(&labels.column(0))
}

/// The class ids of one column as dense `u32` ids `0..C` in order of first appearance (equal
/// exactly where the ids are; comparisons over them vectorise four times wider than over `i64`).
pub(crate) fn dense_ids(column: &[crate::hierarchy::ClassId]) -> Vec<u32> {
    let mut dense = std::collections::HashMap::with_capacity(column.len());
    column
        .iter()
        .map(|c| {
            let next = dense.len() as u32;
            *dense.entry(*c).or_insert(next)
        })
        .collect()
}

/// The `B × B` masks of the positive pairs (same fine class) and of the negative pairs (another
/// fine class) of a batch, the diagonal in neither, as 0 / 1 tensors of `dtype` — what the
/// plain tensor formulations of the pairwise losses multiply their costs by. Built on `device`
/// from the `B` class ids (one comparison), not on the host: at B = 16,384 the two masks are
/// 2 GB of `f32` that would otherwise be written and copied at every step.
pub fn pair_masks(
    labels: &Labels,
    dtype: DType,
    device: &candle_core::Device,
) -> Result<(Tensor, Tensor)> {
    let ids = dense_fine_ids(labels);
    let b = ids.len();
    let ids = Tensor::from_vec(ids, b, device)?;
    let same = ids
        .unsqueeze(1)?
        .broadcast_eq(&ids.unsqueeze(0)?)?
        .to_dtype(dtype)?;
    let eye = Tensor::eye(b, dtype, device)?;
    let pos = (&same - &eye)?;
    let neg = same.affine(-1.0, 1.0)?;
    Ok((pos, neg))
}

/// Whether a loss with a plain tensor formulation (`forward_plain`) runs it instead of the row
/// engine ([`pairwise_rows`]): on a device other than the CPU, where the engine's per-row pass
/// runs on the host and the `B × B` similarities travel there and back at every step (20–90×
/// slower than PyTorch's all-on-GPU formulations at B = 4096 on an H200, benches/gpu/), when no
/// query chunk was asked for and the formulation's largest tensor has at most
/// [`PLAIN_ON_DEVICE_MAX`] values (autograd keeps several of them).
pub(crate) fn plain_on_device(x: &Tensor, query_chunk: Option<usize>, largest: usize) -> bool {
    !x.device().is_cpu() && query_chunk.is_none() && largest <= PLAIN_ON_DEVICE_MAX
}

/// The largest tensor, in values, of a plain formulation run on a device: 2²⁹ (2 GiB of `f32`;
/// FastAP's `B × B × 11` histogram up to B ≈ 7,000, a `B × B` matrix up to B ≈ 23,000).
pub(crate) const PLAIN_ON_DEVICE_MAX: usize = 1 << 29;

/// The value and the gradient of `loss` at the `B × D` matrix `x` (`f64`, or `f32` read as
/// `f64`; a zero gradient where the value does not depend on `x`): for the tests that a loss's
/// fast path equals its plain formulation.
#[cfg(test)]
pub(crate) fn value_and_grad(
    loss: impl Fn(&Tensor) -> Result<Tensor>,
    x: &Tensor,
) -> (f64, Vec<Vec<f64>>) {
    let var = Var::from_tensor(x).unwrap();
    let value = loss(var.as_tensor()).unwrap();
    let grad = match value.backward().unwrap().get(&var) {
        Some(g) => g.clone(),
        None => x.zeros_like().unwrap(),
    };
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    (
        f64s(&value).to_scalar::<f64>().unwrap(),
        f64s(&grad).to_vec2::<f64>().unwrap(),
    )
}

/// The largest absolute difference of two gradients of the same shape.
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The `B × B` matrix of levels of match inside a batch (`levels[q][j]`, diagonal = L), as
/// `u8` row-major. The losses turn it into masks and relevances.
pub fn batch_levels(labels: &Labels) -> Vec<u8> {
    let b = labels.len();
    let mut out = vec![0u8; b * b];
    let mut rows = BatchLevels::new(labels);
    for (q, row) in out.chunks_exact_mut(b.max(1)).enumerate().take(b) {
        rows.row(q, row);
    }
    out
}

/// The levels of match inside a batch one query's row at a time (`labels.level(q, j)` for
/// every `j`), by whole-column comparisons of dense ids that vectorise: every training step of
/// a hierarchical loss builds them before any kernel can start.
pub(crate) struct BatchLevels {
    /// Each level's dense ids, finest first.
    columns: Vec<Vec<u32>>,
    /// Per item, whether it still matches the query at the columns passed so far.
    alive: Vec<u8>,
    /// `at_least[k]`: the items at level `k` or above (the query included), `k = 0..=L`.
    at_least: Vec<usize>,
}

impl BatchLevels {
    pub(crate) fn new(labels: &Labels) -> Self {
        let num_levels = labels.num_levels();
        BatchLevels {
            columns: (0..num_levels)
                .map(|l| dense_ids(&labels.column(l)))
                .collect(),
            alive: vec![0; labels.len()],
            at_least: vec![0; num_levels + 1],
        }
    }

    /// Writes query `q`'s levels of match into `row` (`B` values) and returns `at_least`: the
    /// columns from the coarsest down, each item's level counting the columns it still matches
    /// (`match_level`), the items still matching counted in the same passes.
    pub(crate) fn row(&mut self, q: usize, row: &mut [u8]) -> &[usize] {
        row.fill(0);
        self.alive.fill(1);
        self.at_least[0] = row.len();
        for (k, col) in self.columns.iter().rev().enumerate() {
            let cq = col[q];
            let mut matching = 0u32;
            for ((a, l), &c) in self.alive.iter_mut().zip(row.iter_mut()).zip(col) {
                *a &= u8::from(c == cq);
                *l += *a;
                matching += u32::from(*a);
            }
            self.at_least[k + 1] = matching as usize;
        }
        &self.at_least
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn check_batch_names_the_problem() {
        let y = Labels::from_fine(&[0, 0, 1]).unwrap();
        let ok = Tensor::new(&[[1f32, 0.], [0., 1.], [1., 1.]], &Device::Cpu).unwrap();
        assert!(check_batch(&ok, &y).is_ok());
        let nan = Tensor::new(&[[1f32, 0.], [0., f32::NAN], [1., 1.]], &Device::Cpu).unwrap();
        let e = check_batch(&nan, &y).unwrap_err().to_string();
        assert!(e.contains("row 1"), "{e}");
        let short = Tensor::new(&[[1f32, 0.], [0., 1.]], &Device::Cpu).unwrap();
        let e = check_batch(&short, &y).unwrap_err().to_string();
        assert!(e.contains("2 embeddings but 3 label rows"), "{e}");
        let flat = Tensor::new(&[1f32, 0., 2.], &Device::Cpu).unwrap();
        assert!(check_batch(&flat, &y).is_err());
    }

    #[test]
    fn pair_masks_from_sparse_class_ids() {
        let y = Labels::from_fine(&[70, -3, 70, 12, -3]).unwrap();
        let (pos, neg) = pair_masks(&y, DType::F32, &Device::Cpu).unwrap();
        let pos = pos.to_vec2::<f32>().unwrap();
        let neg = neg.to_vec2::<f32>().unwrap();
        let fine = [70, -3, 70, 12, -3];
        for i in 0..5 {
            for j in 0..5 {
                let same = fine[i] == fine[j];
                assert_eq!(pos[i][j], f32::from(u8::from(i != j && same)), "{i} {j}");
                assert_eq!(neg[i][j], f32::from(u8::from(!same)), "{i} {j}");
            }
        }
    }

    #[test]
    fn the_device_count_of_mean_nonzero_equals_the_host_count() {
        let costs = Tensor::new(&[[0.0f64, 0.5, 0.0], [2.0, 0.0, 0.25]], &Device::Cpu).unwrap();
        let host = mean_nonzero(&costs).unwrap().to_scalar::<f64>().unwrap();
        let device = mean_nonzero_in_place(&costs)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(host, 2.75 / 3.0);
        assert_eq!(device, host);
        // No positive cost: 0, not 0/0.
        let zeros = Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
        let v = mean_nonzero_in_place(&zeros)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(v, 0.0);
    }

    #[test]
    fn batch_levels_has_l_on_the_diagonal() {
        let y = Labels::new(vec![vec![0, 5], vec![1, 5], vec![2, 6]]).unwrap();
        assert_eq!(batch_levels(&y), vec![2, 1, 0, 1, 2, 0, 0, 0, 2]);
    }
}

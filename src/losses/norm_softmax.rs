//! Normalised softmax, "NSM" (Zhai & Wu, "Classification is a Strong Baseline for Deep Metric
//! Learning", BMVC 2019; `azgo14/classification_metric_learning`), the NSM baseline of
//! HAPPIER's tables and — with the fine classes and σ = 0.05 — HAPPIER's clustering loss
//! `L_clust.` (HAPPIER Eq. 6; SupRank `ClusterLoss`).
//!
//! Each class has a learnable proxy `w_c` (a row of a candle [`Var`]); with `p_c = w_c/‖w_c‖`
//! and `v` the L2-normalised embedding, the logits are cosines divided by a temperature σ and
//! the loss is the mean cross-entropy
//!
//! `L = −mean_i log( exp(v_iᵀ p_{y_i}/σ) / Σ_c exp(v_iᵀ p_c/σ) )`  (HAPPIER Eq. 6).
//!
//! With an additive angular margin `m > 0` it is ArcFace (Deng et al., "ArcFace: Additive
//! Angular Margin Loss for Deep Face Recognition", CVPR 2019, Eq. 3; `deepinsight/insightface`):
//! the target logit becomes `cos(θ_{i,y_i} + m)/σ` with `cos θ = v_iᵀ p_{y_i}`, and `1/σ` is
//! ArcFace's scale `s` — the face model of Smooth-AP's Table 4. As in the authors' code, where
//! `θ + m` would pass π (`cos θ ≤ cos(π − m)`) the target logit is `(cos θ − m·sin m)/σ` instead,
//! which keeps it decreasing in θ.
//!
//! Proxies are initialised uniformly in `(−1/√D, 1/√D)` like `nn.Linear` (the authors' code),
//! from a seed. Optimise [`NormSoftmax::proxies`] with its own optimiser, as the authors do
//! (SOP: Adam, lr 10, cosine schedule to 0.1).
//!
//! On CUDA the cross-entropy of the cosines (the division by σ included) is one op of four
//! kernels and its gradient one more (`device.rs` beside this file), where candle's
//! `log_softmax`, `gather` and mean with their autograd took about 25 launches; on the CPU,
//! candle's `cross_entropy`, which the device is checked against.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{positive, LossContext, LossRecipe};
use crate::losses::{check_batch, RankLoss};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

mod device;

/// Normalised-softmax loss over learnable class proxies (see the module documentation).
///
/// ```
/// use candle_core::{Device, Tensor, Var};
/// use rankwise::losses::{norm_softmax::NormSoftmax, RankLoss};
/// use rankwise::Labels;
/// // One proxy per class; each embedding sits on its class's proxy: logits 1/σ = 20 and 0.
/// let proxies = Var::from_tensor(&Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0]], &Device::Cpu)?)?;
/// let loss = NormSoftmax::with_proxies(&[0, 1], proxies)?;
/// let x = Tensor::new(&[[2.0f64, 0.0], [0.0, 3.0]], &Device::Cpu)?;
/// let right = loss.forward(&x, &Labels::from_fine(&[0, 1])?)?.to_scalar::<f64>()?;
/// assert!((right - (1.0 + (-20f64).exp()).ln()).abs() < 1e-15);
/// let wrong = loss.forward(&x, &Labels::from_fine(&[1, 0])?)?.to_scalar::<f64>()?;
/// assert!((wrong - (20.0 + right)).abs() < 1e-9);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct NormSoftmax {
    /// Temperature σ > 0 (authors' code: 0.05).
    pub temperature: f64,
    /// L2-normalise the embeddings so the logits are cosines (the authors' models output
    /// normalised embeddings, so this is what their loss sees). With `false` the embeddings are
    /// used as given (`F.linear(embeddings, normalize(W))`).
    pub normalize_embeddings: bool,
    /// ArcFace's additive angular margin `m` in radians (ArcFace: 0.5); 0 = NSM.
    pub margin: f64,
    proxies: Var,
    classes: Vec<ClassId>,
    index: HashMap<ClassId, u32>,
}

impl NormSoftmax {
    /// The temperature σ of the authors' code (NormSoftmax and HAPPIER's clustering loss).
    pub const PAPER_TEMPERATURE: f64 = 0.05;

    /// One proxy of dimension `dim` per class of `classes` (distinct ids, in that order),
    /// initialised `U(−1/√dim, 1/√dim)` from `seed`, with σ = 0.05.
    pub fn new(
        classes: &[ClassId],
        dim: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::with_proxies(
            classes,
            linear_init_proxies(classes.len(), dim, seed, dtype, device)?,
        )
    }

    /// Uses `proxies` (`C × D`, row `i` for `classes[i]`, distinct ids), e.g. restored from a
    /// checkpoint, with σ = 0.05.
    pub fn with_proxies(classes: &[ClassId], proxies: Var) -> Result<Self> {
        if classes.is_empty() {
            return Err(Error::invalid("classes", "at least one class is needed"));
        }
        let (c, _) = proxies.dims2()?;
        if c != classes.len() {
            return Err(Error::Shape(format!(
                "{c} proxies for {} classes (need one per class)",
                classes.len()
            )));
        }
        let mut index = HashMap::with_capacity(classes.len());
        for (row, &c) in classes.iter().enumerate() {
            if index.insert(c, row as u32).is_some() {
                return Err(Error::invalid(
                    "classes",
                    format!("class {c} appears twice"),
                ));
            }
        }
        Ok(NormSoftmax {
            temperature: Self::PAPER_TEMPERATURE,
            normalize_embeddings: true,
            margin: 0.0,
            proxies,
            classes: classes.to_vec(),
            index,
        })
    }

    /// One proxy per distinct class of column `level` of `labels` (0 = fine), in increasing id
    /// order — the proxies of a training set for that level.
    pub fn for_level(
        labels: &Labels,
        level: usize,
        dim: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::new(&level_classes(labels, level)?, dim, seed, dtype, device)
    }

    /// The learnable proxies (`C × D`, one row per class of [`NormSoftmax::classes`]).
    pub fn proxies(&self) -> &Var {
        &self.proxies
    }

    /// The class id of each proxy row.
    pub fn classes(&self) -> &[ClassId] {
        &self.classes
    }

    /// The logits `v_iᵀ p_c / σ` (`B × C`).
    pub fn logits(&self, embeddings: &Tensor) -> Result<Tensor> {
        Ok((self.cosines(embeddings)? / self.temperature)?)
    }

    /// The cosines `v_iᵀ p_c` (`B × C`), once the temperature is checked.
    fn cosines(&self, embeddings: &Tensor) -> Result<Tensor> {
        check_temperature(self.temperature)?;
        self.unit_cosines(embeddings)
    }

    /// The cosines `v_iᵀ p_c` (`B × C`) of the (normalised, see
    /// [`NormSoftmax::normalize_embeddings`]) embeddings and the normalised proxies.
    pub(crate) fn unit_cosines(&self, embeddings: &Tensor) -> Result<Tensor> {
        let (_, d) = embeddings.dims2()?;
        let (_, pd) = self.proxies.dims2()?;
        if d != pd {
            return Err(Error::Shape(format!(
                "embeddings have dimension {d} but the proxies {pd}"
            )));
        }
        let v = if self.normalize_embeddings {
            crate::losses::l2_normalize(embeddings, "embeddings")?
        } else {
            embeddings.clone()
        };
        let p = crate::losses::l2_normalize(self.proxies.as_tensor(), "proxies")?
            .to_dtype(v.dtype())?;
        Ok(v.matmul(&p.t()?)?)
    }

    /// The proxy row of every item's class (column 0 of `labels`).
    pub(crate) fn target_rows(&self, labels: &Labels) -> Result<Vec<u32>> {
        let mut targets = Vec::with_capacity(labels.len());
        for i in 0..labels.len() {
            let c = labels.fine(i);
            let row = self.index.get(&c).ok_or_else(|| {
                Error::invalid(
                    "labels",
                    format!(
                        "row {i}: class {c} has no proxy (the loss was built for {} other classes)",
                        self.classes.len()
                    ),
                )
            })?;
            targets.push(*row);
        }
        Ok(targets)
    }
}

impl RankLoss for NormSoftmax {
    /// The proxies, named `proxies`.
    fn trainable_vars(&self) -> Vec<(String, Var)> {
        vec![("proxies".into(), self.proxies.clone())]
    }

    /// Mean cross-entropy of the cosine logits against the class of column 0 of `labels` (use
    /// [`crate::losses::summed_levels`] or `labels.coarsen(l)` for another level).
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        if self.margin == 0.0 {
            return self.cosine_cross_entropy(embeddings, labels, self.temperature);
        }
        let rows = self.target_rows(labels)?;
        let targets = Tensor::from_vec(rows.clone(), labels.len(), embeddings.device())?;
        let logits = self.with_angular_margin(&self.logits(embeddings)?, &targets)?;
        if device::applies(&logits) {
            return device::mean_cross_entropy(&logits, rows, 1.0);
        }
        Ok(candle_nn::loss::cross_entropy(&logits, &targets)?)
    }
}

impl NormSoftmax {
    /// The mean cross-entropy of the logits `v_iᵀ p_c / temperature` against each item's class
    /// (column 0 of `labels`), without a margin: NSM at that temperature, whatever
    /// [`NormSoftmax::temperature`] says — the computation ProxyNCA++ shares
    /// ([`crate::losses::proxy_nca_pp`]). The batch is checked by the caller.
    pub(crate) fn cosine_cross_entropy(
        &self,
        embeddings: &Tensor,
        labels: &Labels,
        temperature: f64,
    ) -> Result<Tensor> {
        check_temperature(temperature)?;
        let rows = self.target_rows(labels)?;
        let cosines = self.unit_cosines(embeddings)?;
        // On CUDA one op takes the cosines to the mean cross-entropy, the division by the
        // temperature included (`device`: a launch-bound step's two dozen launches fewer).
        if device::applies(&cosines) {
            return device::mean_cross_entropy(&cosines, rows, 1.0 / temperature);
        }
        let targets = Tensor::from_vec(rows, labels.len(), embeddings.device())?;
        Ok(candle_nn::loss::cross_entropy(
            &(cosines / temperature)?,
            &targets,
        )?)
    }

    /// ArcFace Eq. (3): the logits `cos θ/σ` with each row's target entry replaced by
    /// `cos(θ + m)/σ` (or `(cos θ − m·sin m)/σ` past `θ = π − m`, see the module documentation).
    fn with_angular_margin(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let m = self.margin;
        check_margin(m)?;
        let s = 1.0 / self.temperature;
        let (b, c) = logits.dims2()?;
        let rows = targets.unsqueeze(1)?;
        let cos = (logits.gather(&rows, 1)? / s)?;
        // sin θ = √(1 − cos²θ), floored away from 0 so its derivative stays finite when an
        // embedding sits exactly on its proxy.
        let sin = (1.0 - cos.sqr()?)?.clamp(1e-12, 1.0)?.sqrt()?;
        let shifted = ((&cos * m.cos())? - (sin * m.sin())?)?;
        let past_pi = (&cos - m * m.sin())?;
        let target = cos
            .gt((std::f64::consts::PI - m).cos())?
            .where_cond(&shifted, &past_pi)?;
        // Only the target column changes: add (target − cos)·s there.
        let delta = ((target - cos)? * s)?;
        let mask = candle_nn::encoding::one_hot(targets.clone(), c, 1f32, 0f32)?
            .to_dtype(logits.dtype())?;
        debug_assert_eq!(mask.dims2()?, (b, c));
        Ok((logits + mask.broadcast_mul(&delta)?)?)
    }
}

/// The distinct classes of column `level` of `labels` (0 = fine), in increasing id order: the
/// classes a proxy loss for that level has one proxy each for.
pub(crate) fn level_classes(labels: &Labels, level: usize) -> Result<Vec<ClassId>> {
    if level >= labels.num_levels() {
        return Err(Error::invalid(
            "level",
            format!(
                "level {level} does not exist (labels have {})",
                labels.num_levels()
            ),
        ));
    }
    let mut classes = labels.column(level);
    classes.sort_unstable();
    classes.dedup();
    Ok(classes)
}

/// `rows × dim` proxies drawn `U(−1/√dim, 1/√dim)` from `seed`, as `nn.Linear` initialises its
/// weight (the authors' NSM, HAPPIER's clustering loss and CSL all start their proxies so): the
/// proxies of every proxy loss here but ProxyNCA++, whose authors draw `N(0, 1)/8`.
pub(crate) fn linear_init_proxies(
    rows: usize,
    dim: usize,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<Var> {
    let bound = 1.0 / (dim as f64).sqrt();
    seeded_proxies(rows, dim, seed, dtype, device, |rng| {
        rng.random_range(-bound..bound)
    })
}

/// `rows × dim` learnable proxies, each coordinate `draw(rng)` in row-major order from one
/// ChaCha8 stream seeded with `seed`: the proxies of every proxy loss, whatever its law.
pub(crate) fn seeded_proxies(
    rows: usize,
    dim: usize,
    seed: u64,
    dtype: DType,
    device: &Device,
    mut draw: impl FnMut(&mut ChaCha8Rng) -> f64,
) -> Result<Var> {
    if dim == 0 {
        return Err(Error::invalid("dim", "must be at least 1"));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let init: Vec<f64> = (0..rows * dim).map(|_| draw(&mut rng)).collect();
    let proxies = Tensor::from_vec(init, (rows, dim), device)?.to_dtype(dtype)?;
    Ok(Var::from_tensor(&proxies)?)
}

/// The normalised softmax's recipe (`[loss] kind = "norm_softmax"`): its temperature; the
/// proxies are drawn for the run's fine classes from the run's seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormSoftmaxConfig {
    /// Temperature σ (authors' code: 0.05; ArcFace's scale is `s = 1/σ`).
    pub temperature: f64,
    /// ArcFace's additive angular margin in radians; 0 (the default, left out of the recipe
    /// text) is NSM.
    #[serde(skip_serializing_if = "is_zero")]
    pub margin: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// A temperature must be finite and > 0 (it divides the logits).
fn check_temperature(t: f64) -> Result<()> {
    if t.is_finite() && t > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            "temperature",
            format!("must be finite and > 0, got {t}"),
        ))
    }
}

/// An angular margin is an angle in `[0, π)`: past π the target logit would no longer fall
/// with the angle.
fn check_margin(m: f64) -> Result<()> {
    if m.is_finite() && (0.0..std::f64::consts::PI).contains(&m) {
        Ok(())
    } else {
        Err(Error::invalid(
            "margin",
            format!("must be finite and in [0, π), got {m}"),
        ))
    }
}

impl Default for NormSoftmaxConfig {
    fn default() -> Self {
        NormSoftmaxConfig {
            temperature: NormSoftmax::PAPER_TEMPERATURE,
            margin: 0.0,
        }
    }
}

impl NormSoftmaxConfig {
    /// The loss for a run: one proxy per fine training class (f32, on the run's device), drawn
    /// from the run's seed. HAPPIER's clustering term is built the same way.
    pub fn loss(&self, ctx: &LossContext<'_>) -> Result<NormSoftmax> {
        let mut nsm = NormSoftmax::for_level(
            ctx.train_labels,
            0,
            ctx.dim,
            ctx.seed,
            DType::F32,
            ctx.device,
        )?;
        nsm.temperature = self.temperature;
        nsm.margin = self.margin;
        Ok(nsm)
    }
}

impl LossRecipe for NormSoftmaxConfig {
    fn name(&self) -> String {
        "norm_softmax".into()
    }

    fn validate(&self) -> Result<()> {
        positive("temperature", self.temperature)?;
        check_margin(self.margin)
    }

    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.loss(ctx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_are_seeded_and_bounded() {
        let a = NormSoftmax::new(&[3, 7], 4, 1, DType::F64, &Device::Cpu).unwrap();
        let b = NormSoftmax::new(&[3, 7], 4, 1, DType::F64, &Device::Cpu).unwrap();
        let va = a.proxies().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let vb = b.proxies().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(va, vb);
        assert!(va.iter().all(|v| v.abs() < 0.5));
        assert!(NormSoftmax::new(&[3, 3], 4, 1, DType::F64, &Device::Cpu).is_err());
    }

    #[test]
    fn unknown_class_is_an_error() {
        let nsm = NormSoftmax::new(&[0, 1], 2, 0, DType::F64, &Device::Cpu).unwrap();
        let e = Tensor::new(&[[1f64, 0.0], [0.0, 1.0]], &Device::Cpu).unwrap();
        let y = Labels::from_fine(&[0, 5]).unwrap();
        let err = nsm.forward(&e, &y).unwrap_err().to_string();
        assert!(err.contains("row 1: class 5 has no proxy"), "{err}");
    }
}

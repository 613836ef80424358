//! ProxyNCA++ (Teh, DeVries & Taylor, "ProxyNCA++: Revisiting and Revitalizing Proxy
//! Neighborhood Component Analysis", ECCV 2020; `euwern/proxynca_pp`, whose `ProxyNCA_prob`
//! HAPPIER's authors ran), the NCA++ baseline of HAPPIER's Tables 1, 3 and 4, alone (fine) and
//! summed over the levels (Σ NCA++, [`crate::losses::summed_levels`]).
//!
//! Each class `c` has a learnable proxy `w_c`. With `x̂_i` and `p̂_c = w_c/‖w_c‖` the
//! L2-normalised embedding and proxy, the loss is the cross-entropy of the *proxy assignment
//! probability* at a temperature `T`:
//!
//! `L = −mean_i log( exp(−‖x̂_i − p̂_{y_i}‖²/T) / Σ_c exp(−‖x̂_i − p̂_c‖²/T) )`.
//!
//! Two of the paper's changes to ProxyNCA ([`crate::losses::proxy_nca`]) are in this formula:
//! the positive proxy is in the denominator (a probability, so `L ≥ 0`, where ProxyNCA's ratio
//! over the other proxies alone can go negative), and the temperature is low, `T = 1/9` (the
//! authors scale both unit vectors by `3 = √(1/T)` before the squared distance). As `T → 0`,
//! `T·L` tends to `mean_i (‖x̂_i − p̂_{y_i}‖² − min_c ‖x̂_i − p̂_c‖²)`, the margin by which each
//! item misses its class under the nearest-proxy rule (0 when every item's nearest proxy is its
//! own; tested).
//! The paper's other changes are not the loss — global max pooling, a proxy learning rate 10⁴
//! times the network's — and are the run's to choose: HAPPIER's tables here train every proxy
//! loss with the run's loss group ([`crate::train::OptimizerConfig::loss`]).
//!
//! **How it is computed.** On unit vectors `‖x̂ − p̂‖² = 2 − 2 x̂ᵀp̂`, and a softmax ignores the
//! constant `−2/T` added to every logit, so `L` is the normalised softmax's
//! ([`crate::losses::norm_softmax`]) with the temperature `σ = T/2`, and is computed by NSM's
//! code (one `B × C` product, and NSM's fused cross-entropy op on CUDA). The distance formula is
//! [`ProxyNcaPp::distance_logits`], tested equal. What sets the two baselines apart in a run is
//! then `T/2 = 1/18` against NSM's `1/20`, and the proxies' start: `N(0, 1)/8` per coordinate as
//! the authors draw them, whose norm (`√D/8`, 2.8 at D = 512) is about five times that of NSM's
//! `nn.Linear` draw — under Adam, whose step does not scale with the weight, the direction of a
//! longer proxy turns more slowly at the same rate.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{positive, LossContext, LossRecipe};
use crate::losses::norm_softmax::{level_classes, seeded_proxies, NormSoftmax};
use crate::losses::{check_batch, RankLoss};
use candle_core::{DType, Device, Tensor, Var};
use rand::Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// ProxyNCA++ over learnable class proxies (see the module documentation).
///
/// ```
/// use candle_core::{Device, Tensor, Var};
/// use rankwise::losses::{proxy_nca_pp::ProxyNcaPp, RankLoss};
/// use rankwise::Labels;
/// // Two proxies on the axes; each embedding on its class's proxy: squared distances 0 and 2,
/// // logits 0 and −2/T = −18 at T = 1/9.
/// let proxies = Var::from_tensor(&Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0]], &Device::Cpu)?)?;
/// let loss = ProxyNcaPp::with_proxies(&[0, 1], proxies)?;
/// let x = Tensor::new(&[[2.0f64, 0.0], [0.0, 3.0]], &Device::Cpu)?;
/// let right = loss.forward(&x, &Labels::from_fine(&[0, 1])?)?.to_scalar::<f64>()?;
/// assert!((right - (-18f64).exp().ln_1p()).abs() < 1e-15);
/// // Each on the other class's proxy: 18 more.
/// let wrong = loss.forward(&x, &Labels::from_fine(&[1, 0])?)?.to_scalar::<f64>()?;
/// assert!((wrong - (18.0 + right)).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ProxyNcaPp {
    /// Temperature `T > 0` (paper and authors' code: 1/9).
    pub temperature: f64,
    /// The proxies and their classes, and the cross-entropy of the cosines that computes `L`
    /// (see "How it is computed").
    softmax: NormSoftmax,
}

impl ProxyNcaPp {
    /// The paper's temperature `T = 1/9` (the authors' `scale = 3 = √(1/T)`).
    pub const PAPER_TEMPERATURE: f64 = 1.0 / 9.0;

    /// One proxy of dimension `dim` per class of `classes` (distinct ids, in that order), drawn
    /// `N(0, 1)/8` per coordinate from `seed` as the authors' `torch.randn(C, D) / 8`, with
    /// `T = 1/9`.
    pub fn new(
        classes: &[ClassId],
        dim: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::with_proxies(
            classes,
            gaussian_proxies(classes.len(), dim, seed, dtype, device)?,
        )
    }

    /// Uses `proxies` (`C × D`, row `i` for `classes[i]`, distinct ids), e.g. restored from a
    /// checkpoint, with `T = 1/9`.
    pub fn with_proxies(classes: &[ClassId], proxies: Var) -> Result<Self> {
        Ok(ProxyNcaPp {
            temperature: Self::PAPER_TEMPERATURE,
            softmax: NormSoftmax::with_proxies(classes, proxies)?,
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

    /// The learnable proxies (`C × D`, one row per class of [`ProxyNcaPp::classes`]).
    pub fn proxies(&self) -> &Var {
        self.softmax.proxies()
    }

    /// The class id of each proxy row.
    pub fn classes(&self) -> &[ClassId] {
        self.softmax.classes()
    }

    /// The logits of the formula as the paper writes it, `−‖x̂_i − p̂_c‖²/T` (`B × C`), from the
    /// differences themselves (a `B × C × D` tensor): the plain formulation, which the loss's
    /// cross-entropy of cosines at `T/2` equals up to rounding (tested).
    pub fn distance_logits(&self, embeddings: &Tensor) -> Result<Tensor> {
        distance_logits(embeddings, self.proxies(), self.temperature)
    }
}

impl RankLoss for ProxyNcaPp {
    /// The proxies, named `proxies`.
    fn trainable_vars(&self) -> Vec<(String, Var)> {
        vec![("proxies".into(), self.proxies().clone())]
    }

    /// Mean cross-entropy of the proxy assignment probability against the class of column 0 of
    /// `labels` (use [`crate::losses::summed_levels`] or `labels.coarsen(l)` for another level).
    /// The embeddings are L2-normalised here.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        positive("temperature", self.temperature)?;
        // −‖x̂ − p̂‖²/T = (2 x̂ᵀp̂ − 2)/T: the cosines over T/2, shifted by a constant the softmax
        // ignores (module documentation).
        self.softmax
            .cosine_cross_entropy(embeddings, labels, self.temperature / 2.0)
    }
}

/// `−‖x̂_i − p̂_c‖²/T` (`B × C`) of the L2-normalised embeddings and `proxies`, from the
/// differences themselves (a `B × C × D` tensor): the formula as the proxy NCA papers write it,
/// which ProxyNCA++ and ProxyNCA ([`crate::losses::proxy_nca`]) are tested against.
pub(crate) fn distance_logits(
    embeddings: &Tensor,
    proxies: &Var,
    temperature: f64,
) -> Result<Tensor> {
    positive("temperature", temperature)?;
    let x = crate::losses::l2_normalize(embeddings, "embeddings")?;
    let p = crate::losses::l2_normalize(proxies.as_tensor(), "proxies")?.to_dtype(x.dtype())?;
    let (b, d) = x.dims2()?;
    let (c, pd) = p.dims2()?;
    if d != pd {
        return Err(Error::Shape(format!(
            "embeddings have dimension {d} but the proxies {pd}"
        )));
    }
    let diff = x
        .unsqueeze(1)?
        .broadcast_as((b, c, d))?
        .broadcast_sub(&p.unsqueeze(0)?)?;
    Ok((diff.sqr()?.sum(2)? * (-1.0 / temperature))?)
}

/// `rows × dim` proxies drawn `N(0, 1)/8` per coordinate from `seed`, as the authors'
/// `torch.randn(nb_classes, sz_embed) / 8` (Roth & Brattoli's ProxyNCA draws them so too).
pub(crate) fn gaussian_proxies(
    rows: usize,
    dim: usize,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<Var> {
    seeded_proxies(rows, dim, seed, dtype, device, |rng| {
        rng.sample::<f64, _>(StandardNormal) / 8.0
    })
}

/// ProxyNCA++'s recipe (`[loss] kind = "proxy_nca_pp"`): its temperature; the proxies are drawn
/// for the run's fine classes from the run's seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyNcaPpConfig {
    /// Temperature `T` (paper: 1/9).
    pub temperature: f64,
}

impl Default for ProxyNcaPpConfig {
    fn default() -> Self {
        ProxyNcaPpConfig {
            temperature: ProxyNcaPp::PAPER_TEMPERATURE,
        }
    }
}

impl ProxyNcaPpConfig {
    /// The loss for a run: one proxy per fine training class (f32, on the run's device), drawn
    /// from the run's seed.
    pub fn loss(&self, ctx: &LossContext<'_>) -> Result<ProxyNcaPp> {
        let mut loss = ProxyNcaPp::for_level(
            ctx.train_labels,
            0,
            ctx.dim,
            ctx.seed,
            DType::F32,
            ctx.device,
        )?;
        loss.temperature = self.temperature;
        Ok(loss)
    }
}

impl LossRecipe for ProxyNcaPpConfig {
    fn name(&self) -> String {
        "proxy_nca_pp".into()
    }

    fn validate(&self) -> Result<()> {
        positive("temperature", self.temperature)
    }

    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.loss(ctx)?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const CPU: Device = Device::Cpu;

    /// A seeded batch of `b × d` embeddings and their classes `7i mod classes` (shared with
    /// ProxyNCA's tests).
    pub(crate) fn batch(b: usize, d: usize, classes: i64, seed: u64) -> (Tensor, Labels) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let x: Vec<f64> = (0..b * d).map(|_| rng.sample(StandardNormal)).collect();
        let y: Vec<i64> = (0..b as i64).map(|i| (i * 7) % classes).collect();
        (
            Tensor::from_vec(x, (b, d), &CPU).unwrap(),
            Labels::from_fine(&y).unwrap(),
        )
    }

    pub(crate) fn scalar(t: Tensor) -> f64 {
        t.to_scalar::<f64>().unwrap()
    }

    #[test]
    fn proxies_are_seeded_gaussians_over_eight() {
        let a = ProxyNcaPp::new(&[3, 7], 2000, 1, DType::F64, &CPU).unwrap();
        let b = ProxyNcaPp::new(&[3, 7], 2000, 1, DType::F64, &CPU).unwrap();
        let va = a.proxies().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let vb = b.proxies().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(va, vb);
        let c = ProxyNcaPp::new(&[3, 7], 2000, 2, DType::F64, &CPU).unwrap();
        assert_ne!(
            va,
            c.proxies().flatten_all().unwrap().to_vec1::<f64>().unwrap()
        );
        // 4,000 draws of N(0, 1/64): mean 0 and variance 1/64 within five standard errors.
        let n = va.len() as f64;
        let mean = va.iter().sum::<f64>() / n;
        let var = va.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!(mean.abs() < 5.0 * (1.0f64 / 64.0 / n).sqrt(), "{mean}");
        assert!((var * 64.0 - 1.0).abs() < 5.0 * (2.0 / n).sqrt(), "{var}");
        assert!(ProxyNcaPp::new(&[3, 3], 4, 1, DType::F64, &CPU).is_err());
        assert!(ProxyNcaPp::new(&[3], 0, 1, DType::F64, &CPU).is_err());
    }

    #[test]
    fn the_loss_is_the_cross_entropy_of_the_distance_logits() {
        let (x, y) = batch(24, 6, 5, 3);
        for t in [ProxyNcaPp::PAPER_TEMPERATURE, 0.5, 2.0] {
            let mut loss = ProxyNcaPp::for_level(&y, 0, 6, 9, DType::F64, &CPU).unwrap();
            loss.temperature = t;
            let rows: Vec<u32> = (0..y.len())
                .map(|i| loss.classes().iter().position(|&c| c == y.fine(i)).unwrap() as u32)
                .collect();
            let targets = Tensor::from_vec(rows, y.len(), &CPU).unwrap();
            let plain = scalar(
                candle_nn::loss::cross_entropy(&loss.distance_logits(&x).unwrap(), &targets)
                    .unwrap(),
            );
            let fast = scalar(loss.forward(&x, &y).unwrap());
            assert!(
                (plain - fast).abs() < 1e-13 * plain.max(1.0),
                "T = {t}: {plain} vs {fast}"
            );
        }
    }

    #[test]
    fn it_is_the_normalised_softmax_at_half_the_temperature() {
        let (x, y) = batch(16, 5, 4, 1);
        let pnca = ProxyNcaPp::for_level(&y, 0, 5, 2, DType::F64, &CPU).unwrap();
        let mut nsm = NormSoftmax::with_proxies(pnca.classes(), pnca.proxies().clone()).unwrap();
        nsm.temperature = pnca.temperature / 2.0;
        assert_eq!(
            scalar(pnca.forward(&x, &y).unwrap()),
            scalar(nsm.forward(&x, &y).unwrap())
        );
    }

    #[test]
    fn as_the_temperature_falls_t_times_the_loss_tends_to_the_nearest_proxy_margin() {
        let (x, y) = batch(20, 4, 5, 7);
        let mut loss = ProxyNcaPp::for_level(&y, 0, 4, 5, DType::F64, &CPU).unwrap();
        // The exact twin: each item's squared distance to its own proxy minus the smallest.
        loss.temperature = 1.0;
        let d = (loss.distance_logits(&x).unwrap() * -1.0)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        let twin = (0..y.len())
            .map(|i| {
                let own = loss.classes().iter().position(|&c| c == y.fine(i)).unwrap();
                d[i][own] - d[i].iter().cloned().fold(f64::INFINITY, f64::min)
            })
            .sum::<f64>()
            / y.len() as f64;
        assert!(
            twin > 0.1,
            "a batch where some item misses its proxy: {twin}"
        );
        let mut last = f64::INFINITY;
        for t in [1e-1, 1e-2, 1e-3, 1e-4] {
            loss.temperature = t;
            let gap = (t * scalar(loss.forward(&x, &y).unwrap()) - twin).abs();
            // The gap is at most T·ln C (the softmax's log-sum-exp above the max), and shrinks
            // until rounding is all that is left.
            assert!(gap <= t * 5f64.ln() + 1e-12, "T = {t}: gap {gap}");
            assert!(gap < last || gap < 1e-12, "T = {t}: gap {gap} after {last}");
            last = gap;
        }
        assert!(last < 1e-3);
    }

    #[test]
    fn a_bad_temperature_or_class_is_refused_naming_it() {
        let (x, y) = batch(4, 3, 2, 0);
        let mut loss = ProxyNcaPp::for_level(&y, 0, 3, 0, DType::F64, &CPU).unwrap();
        for t in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            loss.temperature = t;
            let e = loss.forward(&x, &y).unwrap_err().to_string();
            assert!(e.contains("temperature"), "{e}");
            let config = ProxyNcaPpConfig { temperature: t };
            assert!(config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("loss.temperature"));
        }
        loss.temperature = ProxyNcaPp::PAPER_TEMPERATURE;
        let other = Labels::from_fine(&[0, 1, 0, 5]).unwrap();
        let e = loss.forward(&x, &other).unwrap_err().to_string();
        assert!(e.contains("row 3: class 5 has no proxy"), "{e}");
    }
}

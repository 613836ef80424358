//! ProxyNCA (Movshovitz-Attias et al., "No Fuss Distance Metric Learning using Proxies", ICCV
//! 2017) as Roth & Brattoli re-implemented it (`Confusezius/Deep-Metric-Learning-Baselines`):
//! the "Proxy NCA†" row of Smooth-AP's Table 3 (right; the re-implementation \[55\], one proxy
//! per training class) and the Proxy NCA row of RaMBO's Table 2.
//!
//! Each class `c` has a learnable proxy `w_c`. With `x̂_i` and `p̂_c = w_c/‖w_c‖` the
//! L2-normalised embedding and proxy, and `d_ic = ‖x̂_i − p̂_c‖²/T`, the loss is Movshovitz-Attias
//! et al.'s proxy NCA: the ratio of the positive proxy's weight to the *other* proxies':
//!
//! `L = −mean_i log( exp(−d_{i,y_i}) / Σ_{c ≠ y_i} exp(−d_ic) )
//!    = mean_i ( d_{i,y_i} + log Σ_{c ≠ y_i} exp(−d_ic) )`.
//!
//! The re-implementation scales both unit vectors by 3 before the squared distance, which is
//! `T = 1/9` here, and draws the proxies `N(0, 1)/8` per coordinate — ProxyNCA++'s temperature
//! and start ([`crate::losses::proxy_nca_pp`]), so the two differ only by the positive proxy in
//! the denominator: `L_i = L^{++}_i + log(1 − P_i)`, with `P_i` ProxyNCA++'s probability of the
//! item's own proxy (tested). Without the positive in the denominator the loss is not a
//! probability: it goes negative once an item is nearer its own proxy than the others, and
//! keeps falling as it moves further in, which is what ProxyNCA++'s authors changed.
//!
//! As `T → 0`, `T·L` tends to `mean_i (T d_{i,y_i} − min_{c ≠ y_i} T d_ic)`: the margin by which
//! each item's own proxy is farther than the nearest other one, negative where it is nearer
//! (tested).
//!
//! **How it is computed.** On unit vectors `‖x̂ − p̂‖² = 2 − 2 x̂ᵀp̂`, and the constant `2/T`
//! cancels between the two terms, so `L = mean_i ( log Σ_{c ≠ y_i} exp(s_ic) − s_{i,y_i} )` with
//! the cosine logits `s = x̂ᵀp̂ / (T/2)` — one `B × C` product as NSM's
//! ([`crate::losses::norm_softmax`]), the positive column set to `−∞` before a stable
//! log-sum-exp. Every step is a candle op on the embeddings' device, the mask included (built
//! there from the class indices), so CUDA runs it as the CPU does. The distance formula is
//! [`ProxyNca::distance_logits`], tested equal.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{positive, LossContext, LossRecipe};
use crate::losses::norm_softmax::{level_classes, NormSoftmax};
use crate::losses::proxy_nca_pp::{distance_logits, gaussian_proxies, ProxyNcaPp};
use crate::losses::{check_batch, RankLoss};
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

/// ProxyNCA over learnable class proxies, the positive proxy left out of the denominator (see
/// the module documentation).
///
/// ```
/// use candle_core::{Device, Tensor, Var};
/// use rankwise::losses::{proxy_nca::ProxyNca, RankLoss};
/// use rankwise::Labels;
/// // Two proxies on the axes; each embedding on its class's proxy: d = 0 to its own, 2/T = 18
/// // to the other, so L = 0 + log exp(−18) = −18.
/// let proxies = Var::from_tensor(&Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0]], &Device::Cpu)?)?;
/// let loss = ProxyNca::with_proxies(&[0, 1], proxies)?;
/// let x = Tensor::new(&[[2.0f64, 0.0], [0.0, 3.0]], &Device::Cpu)?;
/// let right = loss.forward(&x, &Labels::from_fine(&[0, 1])?)?.to_scalar::<f64>()?;
/// assert!((right + 18.0).abs() < 1e-12);
/// // Each on the other class's proxy: +18.
/// let wrong = loss.forward(&x, &Labels::from_fine(&[1, 0])?)?.to_scalar::<f64>()?;
/// assert!((wrong - 18.0).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ProxyNca {
    /// Temperature `T > 0` (Roth & Brattoli's scale 3 on both unit vectors: `T = 1/9`).
    pub temperature: f64,
    /// The proxies, their classes and the cosines (see "How it is computed").
    softmax: NormSoftmax,
}

impl ProxyNca {
    /// The re-implementation's temperature `T = 1/9` (its scale `3 = √(1/T)`), ProxyNCA++'s too.
    pub const PAPER_TEMPERATURE: f64 = ProxyNcaPp::PAPER_TEMPERATURE;

    /// One proxy of dimension `dim` per class of `classes` (at least two distinct ids, in that
    /// order), drawn `N(0, 1)/8` per coordinate from `seed` as the re-implementation's
    /// `torch.randn(C, D) / 8`, with `T = 1/9`.
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

    /// Uses `proxies` (`C × D`, row `i` for `classes[i]`, at least two distinct ids), e.g.
    /// restored from a checkpoint, with `T = 1/9`.
    pub fn with_proxies(classes: &[ClassId], proxies: Var) -> Result<Self> {
        // The denominator sums over the proxies of the other classes: with one class it is
        // empty and the loss −∞.
        if classes.len() < 2 {
            return Err(Error::invalid(
                "classes",
                format!(
                    "ProxyNCA needs at least two classes (its denominator is the other classes' \
                     proxies), got {}",
                    classes.len()
                ),
            ));
        }
        Ok(ProxyNca {
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

    /// The learnable proxies (`C × D`, one row per class of [`ProxyNca::classes`]).
    pub fn proxies(&self) -> &Var {
        self.softmax.proxies()
    }

    /// The class id of each proxy row.
    pub fn classes(&self) -> &[ClassId] {
        self.softmax.classes()
    }

    /// The negated distances as the paper writes them, `−‖x̂_i − p̂_c‖²/T` (`B × C`), from the
    /// differences themselves (a `B × C × D` tensor): the plain formulation, whose
    /// `mean_i (log Σ_{c ≠ y_i} exp(·) − ·_{i,y_i})` the loss equals up to rounding (tested).
    pub fn distance_logits(&self, embeddings: &Tensor) -> Result<Tensor> {
        distance_logits(embeddings, self.proxies(), self.temperature)
    }
}

impl RankLoss for ProxyNca {
    /// The proxies, named `proxies`.
    fn trainable_vars(&self) -> Vec<(String, Var)> {
        vec![("proxies".into(), self.proxies().clone())]
    }

    /// `mean_i (log Σ_{c ≠ y_i} exp(s_ic) − s_{i,y_i})` against the class of column 0 of
    /// `labels`, with `s` the cosines over `T/2` (use [`crate::losses::summed_levels`] or
    /// `labels.coarsen(l)` for another level). The embeddings are L2-normalised here.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        positive("temperature", self.temperature)?;
        let rows = self.softmax.target_rows(labels)?;
        let cosines = self.softmax.unit_cosines(embeddings)?;
        let device = &cosines.device().clone();
        let (b, c) = cosines.dims2()?;
        // −‖x̂ − p̂‖²/T = (2 x̂ᵀp̂ − 2)/T; the −2/T is in both terms and cancels.
        let logits = (cosines * (2.0 / self.temperature))?;
        let targets = Tensor::from_vec(rows, (b, 1), device)?;
        let positive_logit = logits.gather(&targets, 1)?.squeeze(1)?;
        // The positive's column, found on the device: a B × C mask never crosses from the host.
        let own = targets.broadcast_eq(&Tensor::arange(0u32, c as u32, device)?.unsqueeze(0)?)?;
        let minus_infinity =
            Tensor::full(f64::NEG_INFINITY, (b, c), device)?.to_dtype(logits.dtype())?;
        // log-sum-exp subtracts the row's maximum (finite: at least one other class), so the
        // masked entries contribute exp(−∞) = 0 and no gradient.
        let others = own.where_cond(&minus_infinity, &logits)?.log_sum_exp(1)?;
        Ok((others - positive_logit)?.mean(0)?)
    }
}

/// ProxyNCA's recipe (`[loss] kind = "proxy_nca"`): its temperature; the proxies are drawn for
/// the run's fine classes from the run's seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyNcaConfig {
    /// Temperature `T` (Roth & Brattoli: scale 3, `T = 1/9`).
    pub temperature: f64,
}

impl Default for ProxyNcaConfig {
    fn default() -> Self {
        ProxyNcaConfig {
            temperature: ProxyNca::PAPER_TEMPERATURE,
        }
    }
}

impl ProxyNcaConfig {
    /// The loss for a run: one proxy per fine training class (f32, on the run's device), drawn
    /// from the run's seed.
    pub fn loss(&self, ctx: &LossContext<'_>) -> Result<ProxyNca> {
        let mut loss = ProxyNca::for_level(
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

impl LossRecipe for ProxyNcaConfig {
    fn name(&self) -> String {
        "proxy_nca".into()
    }

    fn validate(&self) -> Result<()> {
        positive("temperature", self.temperature)
    }

    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.loss(ctx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::proxy_nca_pp::tests::{batch, scalar};

    const CPU: Device = Device::Cpu;

    /// Row `i`'s proxy index.
    fn own(loss: &ProxyNca, y: &Labels, i: usize) -> usize {
        loss.classes().iter().position(|&c| c == y.fine(i)).unwrap()
    }

    #[test]
    fn the_loss_is_the_ratio_over_the_other_proxies_of_the_distance_logits() {
        let (x, y) = batch(24, 6, 5, 3);
        for t in [ProxyNca::PAPER_TEMPERATURE, 0.5, 2.0] {
            let mut loss = ProxyNca::for_level(&y, 0, 6, 9, DType::F64, &CPU).unwrap();
            loss.temperature = t;
            let l = loss.distance_logits(&x).unwrap().to_vec2::<f64>().unwrap();
            let plain = (0..y.len())
                .map(|i| {
                    let k = own(&loss, &y, i);
                    let others: f64 = (0..l[i].len())
                        .filter(|&c| c != k)
                        .map(|c| l[i][c].exp())
                        .sum();
                    others.ln() - l[i][k]
                })
                .sum::<f64>()
                / y.len() as f64;
            let fast = scalar(loss.forward(&x, &y).unwrap());
            assert!(
                (plain - fast).abs() < 1e-12 * plain.abs().max(1.0),
                "T = {t}: {plain} vs {fast}"
            );
        }
    }

    #[test]
    fn it_is_proxy_nca_pp_plus_the_log_of_the_other_classes_probability() {
        // Per item: L_i = L++_i + log(1 − P_i), with the same proxies and temperature.
        let (x, y) = batch(9, 5, 4, 1);
        let nca = ProxyNca::for_level(&y, 0, 5, 2, DType::F64, &CPU).unwrap();
        let pp = ProxyNcaPp::with_proxies(nca.classes(), nca.proxies().clone()).unwrap();
        // Both draw their proxies N(0, 1)/8 from the seed, the same stream.
        let drawn = |v: &Var| v.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let pp_drawn = ProxyNcaPp::for_level(&y, 0, 5, 2, DType::F64, &CPU).unwrap();
        assert_eq!(drawn(nca.proxies()), drawn(pp_drawn.proxies()));
        for i in 0..y.len() {
            let xi = x.narrow(0, i, 1).unwrap();
            let yi = Labels::from_fine(&[y.fine(i)]).unwrap();
            let plus = scalar(pp.forward(&xi, &yi).unwrap());
            let p_own = (-plus).exp();
            let want = plus + (1.0 - p_own).ln();
            let got = scalar(nca.forward(&xi, &yi).unwrap());
            assert!((got - want).abs() < 1e-12, "item {i}: {got} vs {want}");
        }
    }

    #[test]
    fn as_the_temperature_falls_t_times_the_loss_tends_to_the_own_proxy_margin() {
        let (x, y) = batch(20, 4, 5, 7);
        let mut loss = ProxyNca::for_level(&y, 0, 4, 5, DType::F64, &CPU).unwrap();
        // The exact twin: each item's squared distance to its own proxy minus the smallest to
        // another class's (negative where its own is the nearest).
        loss.temperature = 1.0;
        let d = (loss.distance_logits(&x).unwrap() * -1.0)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        let margins: Vec<f64> = (0..y.len())
            .map(|i| {
                let k = own(&loss, &y, i);
                let nearest_other = (0..d[i].len())
                    .filter(|&c| c != k)
                    .map(|c| d[i][c])
                    .fold(f64::INFINITY, f64::min);
                d[i][k] - nearest_other
            })
            .collect();
        assert!(
            margins.iter().any(|&m| m < 0.0) && margins.iter().any(|&m| m > 0.0),
            "a batch with items on both sides: {margins:?}"
        );
        let twin = margins.iter().sum::<f64>() / y.len() as f64;
        let mut last = f64::INFINITY;
        for t in [1e-1, 1e-2, 1e-3, 1e-4] {
            loss.temperature = t;
            let gap = (t * scalar(loss.forward(&x, &y).unwrap()) - twin).abs();
            // log-sum-exp exceeds the max by at most T·ln(C − 1), over the 4 other classes.
            assert!(gap <= t * 4f64.ln() + 1e-12, "T = {t}: gap {gap}");
            assert!(gap < last || gap < 1e-12, "T = {t}: gap {gap} after {last}");
            last = gap;
        }
        assert!(last < 1e-3);
    }

    #[test]
    fn the_loss_goes_below_zero_and_keeps_falling_where_proxy_nca_pp_cannot() {
        // An item moving onto its own proxy, away from the other: ProxyNCA++ stays ≥ 0,
        // ProxyNCA goes negative and keeps falling.
        let proxies =
            Var::from_tensor(&Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0]], &CPU).unwrap()).unwrap();
        let nca = ProxyNca::with_proxies(&[0, 1], proxies.clone()).unwrap();
        let pp = ProxyNcaPp::with_proxies(&[0, 1], proxies).unwrap();
        let y = Labels::from_fine(&[0]).unwrap();
        let mut last = f64::INFINITY;
        for angle in [1.0f64, 0.5, 0.2, 0.0] {
            let x = Tensor::new(&[[angle.cos(), angle.sin()]], &CPU).unwrap();
            let l = scalar(nca.forward(&x, &y).unwrap());
            assert!(l < last, "{angle}: {l} after {last}");
            last = l;
            assert!(scalar(pp.forward(&x, &y).unwrap()) >= 0.0);
        }
        assert!(last < 0.0);
    }

    #[test]
    fn bad_temperatures_classes_and_single_class_proxies_are_refused_naming_them() {
        let (x, y) = batch(4, 3, 2, 0);
        let mut loss = ProxyNca::for_level(&y, 0, 3, 0, DType::F64, &CPU).unwrap();
        for t in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            loss.temperature = t;
            let e = loss.forward(&x, &y).unwrap_err().to_string();
            assert!(e.contains("temperature"), "{e}");
            let config = ProxyNcaConfig { temperature: t };
            assert!(config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("loss.temperature"));
        }
        loss.temperature = ProxyNca::PAPER_TEMPERATURE;
        let other = Labels::from_fine(&[0, 1, 0, 5]).unwrap();
        let e = loss.forward(&x, &other).unwrap_err().to_string();
        assert!(e.contains("row 3: class 5 has no proxy"), "{e}");
        let e = ProxyNca::new(&[4], 3, 0, DType::F64, &CPU)
            .unwrap_err()
            .to_string();
        assert!(e.contains("classes") && e.contains("at least two"), "{e}");
        assert!(ProxyNca::new(&[3, 3], 4, 1, DType::F64, &CPU).is_err());
    }
}

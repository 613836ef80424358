//! CSL, the hierarchical proxy loss of Sun et al., "Dynamic Metric Learning: Towards a Scalable
//! Metric Space to Accommodate Multiple Semantic Scales" (CVPR 2021; HAPPIER's reference 47), as
//! re-implemented by HAPPIER's authors (HAPPIER supp. B.5, their `happier/losses/csl_loss.py`):
//! the CSL rows of HAPPIER's Tables 1–4.
//!
//! Each fine training class `c` has a learnable proxy `w_c` (a row of a candle [`Var`]). With
//! `p_c = w_c/‖w_c‖`, `v_i` the L2-normalised embedding of item `i` and `s_ic = v_iᵀ p_c` its
//! cosine with proxy `c`, and `y_l(·)` the class at label level `l` (our [`Labels`] convention,
//! the HAPPIER code's: level 0 is the fine class, level `L − 1` the coarsest):
//!
//! - the negatives of item `i` at level `l` are the proxies of the *other level-`l` classes*,
//!   `N_l(i) = {c : y_l(c) ≠ y_l(i)}`, and `LSE⁻_l(i) = log Σ_{c ∈ N_l(i)} exp(s · s_ic)`;
//! - its positive is its own fine class's proxy at every level, `LSE⁺(i) = log Σ_{c : y_0(c) =
//!   y_0(i)} exp(−s · s_ic) = −s · s_{i,y_0(i)}` (one proxy per fine class);
//! - `L_l = mean_i softplus(LSE⁻_l(i) + LSE⁺(i) + m_l · s)` and `L = Σ_l L_l` (the code's `sum`
//!   reduction).
//!
//! `softplus(log Σ_neg e^{s·s_neg} − s·s_pos + s·m)` is `s` times a smooth hinge
//! `max(0, max_neg s_neg − s_pos + m)`: at level `l` the own proxy must be closer than every
//! proxy of another level-`l` class by the margin `m_l`. The margins grow with the level, so that another family's
//! proxy must be further away than another fine class of the same family; proxies of the same
//! level-`l` class but another fine class are neither positive nor negative at that level.
//!
//! Hyperparameters ([`CslConfig`], the authors' configurations): the scale `s = 32`; the margins
//! `0.25 / 0.45` for two levels (SOP, iNat-base), `0.25 / 0.35 / 0.45` for three (DyML) and
//! `0.15, 0.25, …, 0.75` for iNat-full's seven, finest first ([`Csl::paper_margins`] gives the
//! rule for other depths).
//!
//! A level where every proxy shares the item's class (the training set is one class at that
//! level) leaves the item no negative: `LSE⁻ = log 0 = −∞` and `softplus(−∞) = 0`, so the item
//! adds 0 to that level's mean (still counted in its `B`), as the authors' masked log-sum-exp of
//! an empty set gives. Here that term is kept out of the graph (a log of 0 would put infinities
//! in it): the gradient is that of the other terms.
//!
//! The embeddings are L2-normalised here, as [`crate::losses::norm_softmax::NormSoftmax`] does by
//! default: the authors' models end with an L2 normalisation and their loss takes the embeddings
//! as given, and normalising a unit vector again changes neither the value nor the gradient
//! through the model. Proxies are initialised like `nn.Linear`, `U(−1/√D, 1/√D)` from a seed,
//! one per fine training class in increasing id order (the code's `labels.unique(dim=0)`), and
//! returned by [`RankLoss::trainable_vars`], so that the trainer gives them their own parameter
//! group (`[optimizer.loss]`, as the proxies of NSM and of HAPPIER's clustering loss; the
//! authors: their own Adam, lr 10 on SOP).

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{positive, LossContext, LossRecipe};
use crate::losses::norm_softmax::linear_init_proxies;
use crate::losses::{check_batch, l2_normalize, RankLoss};
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// CSL, Sun et al. CVPR 2021, as re-implemented by HAPPIER's authors (§B): one learnable proxy
/// per fine class and, at every label level, a soft margin between an item's own proxy and the
/// proxies of the other classes of that level (see the module documentation).
///
/// ```
/// use candle_core::{Device, Tensor, Var};
/// use rankwise::losses::{csl::Csl, RankLoss};
/// use rankwise::Labels;
/// // Three fine classes on the axes; classes 0 and 1 share coarse class 10, class 2 is alone
/// // in coarse class 11. One item of class 0, on its own proxy.
/// let proxy_labels = Labels::new(vec![vec![0, 10], vec![1, 10], vec![2, 11]])?;
/// let proxies = Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0], [-1.0, 0.0]], &Device::Cpu)?;
/// let mut csl = Csl::with_proxies(&proxy_labels, Var::from_tensor(&proxies)?)?;
/// csl.scale = 2.0;
/// csl.margins = vec![0.1, 0.3];
/// let x = Tensor::new(&[[3.0f64, 0.0]], &Device::Cpu)?;
/// let loss = csl.forward(&x, &Labels::new(vec![vec![0, 10]])?)?.to_scalar::<f64>()?;
/// // Cosines 1, 0, −1. Fine level: negatives are proxies 1 and 2; coarse level: proxy 2 only.
/// let softplus = |x: f64| x.exp().ln_1p();
/// let fine = softplus((1f64 + (-2f64).exp()).ln() - 2.0 + 0.1 * 2.0);
/// let coarse = softplus(-2.0 - 2.0 + 0.3 * 2.0);
/// assert!((loss - (fine + coarse)).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Csl {
    /// The scale `s` of the cosines (the authors': 32).
    pub scale: f64,
    /// The margin `m_l` of each label level, finest first: one per level of the labels.
    pub margins: Vec<f64>,
    proxies: Var,
    /// The label row of each proxy (`C × L`, finest first), one proxy per fine class.
    proxy_labels: Labels,
    /// The proxy row of each fine class.
    index: HashMap<ClassId, u32>,
    /// For each level, the proxies' class ids at that level (`1 × C`, i64, on the proxies'
    /// device), compared with a batch's labels to find the negatives.
    level_ids: Vec<Tensor>,
    /// For each level, how many proxies each class of that level has: an item has no negative
    /// at level `l` exactly when its class there has all `C` proxies.
    level_counts: Vec<HashMap<ClassId, usize>>,
}

impl Csl {
    /// The scale `s` of the authors' configurations.
    pub const PAPER_SCALE: f64 = 32.0;

    /// iNat-full's seven margins, finest first (the authors' `csl_inat.yaml`).
    const INAT_FULL_MARGINS: [f64; 7] = [0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75];

    /// The margins for labels of `levels` levels, finest first. The authors give three sets:
    /// `[0.25, 0.45]` for two levels (SOP, iNat-base), `[0.25, 0.35, 0.45]` for three (DyML)
    /// and `[0.15, 0.25, …, 0.75]` for seven (iNat-full). For other depths ours is: one level,
    /// `[0.25]` (the fine margin of the two- and three-level sets); four to six levels, the
    /// first `levels` of iNat-full's seven (the deep hierarchies stand beside iNat-full: our
    /// six-level data of HAPPIER's Table 4 gets `0.15 … 0.65`, its species … phylum). Deeper
    /// than seven levels has no authors' value to extend: an error asking for `margins`.
    pub fn paper_margins(levels: usize) -> Result<Vec<f64>> {
        match levels {
            1 => Ok(vec![0.25]),
            2 => Ok(vec![0.25, 0.45]),
            3 => Ok(vec![0.25, 0.35, 0.45]),
            4..=7 => Ok(Self::INAT_FULL_MARGINS[..levels].to_vec()),
            _ => Err(Error::invalid(
                "margins",
                format!(
                    "the authors' margins cover 2, 3 and 7 label levels (ours: 1 to 7); for \
                     {levels} levels give one margin per level, finest first"
                ),
            )),
        }
    }

    /// One proxy of dimension `dim` per fine class of the training labels `train_labels`, in
    /// increasing id order, drawn `U(−1/√dim, 1/√dim)` from `seed`; `s = 32` and
    /// [`Csl::paper_margins`] for their number of levels (as in [`Csl::with_proxies`]).
    pub fn new(
        train_labels: &Labels,
        dim: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        // One label row per fine class: a hierarchy gives every fine class one row.
        let mut rows: Vec<Vec<ClassId>> = (0..train_labels.len())
            .map(|i| train_labels.row(i).to_vec())
            .collect();
        rows.sort_unstable();
        rows.dedup();
        let proxy_labels = Labels::new(rows)?;
        let proxies = linear_init_proxies(proxy_labels.len(), dim, seed, dtype, device)?;
        Self::with_proxies(&proxy_labels, proxies)
    }

    /// Uses `proxies` (`C × D`), row `i` being the proxy of the fine class of row `i` of
    /// `proxy_labels` (`C × L`, distinct fine classes), e.g. restored from a checkpoint; `s = 32`
    /// and [`Csl::paper_margins`] for `L` levels (none past seven levels: set
    /// [`Csl::margins`]).
    pub fn with_proxies(proxy_labels: &Labels, proxies: Var) -> Result<Self> {
        let (c, _) = proxies.dims2()?;
        if c != proxy_labels.len() {
            return Err(Error::Shape(format!(
                "{c} proxies for {} label rows (need one per fine class)",
                proxy_labels.len()
            )));
        }
        let mut index = HashMap::with_capacity(c);
        for row in 0..c {
            let fine = proxy_labels.fine(row);
            if index.insert(fine, row as u32).is_some() {
                return Err(Error::invalid(
                    "classes",
                    format!("fine class {fine} has two proxy rows"),
                ));
            }
        }
        let levels = proxy_labels.num_levels();
        let mut level_ids = Vec::with_capacity(levels);
        let mut level_counts = Vec::with_capacity(levels);
        for l in 0..levels {
            let ids = proxy_labels.column(l);
            let mut counts: HashMap<ClassId, usize> = HashMap::new();
            for &id in &ids {
                *counts.entry(id).or_default() += 1;
            }
            level_ids.push(Tensor::from_vec(ids, (1, c), proxies.device())?);
            level_counts.push(counts);
        }
        Ok(Csl {
            scale: Self::PAPER_SCALE,
            // Past seven levels there is no default: the margins must be set before use.
            margins: Self::paper_margins(levels).unwrap_or_default(),
            proxies,
            proxy_labels: proxy_labels.clone(),
            index,
            level_ids,
            level_counts,
        })
    }

    /// The learnable proxies (`C × D`, one row per fine class of [`Csl::proxy_labels`]).
    pub fn proxies(&self) -> &Var {
        &self.proxies
    }

    /// The label row of each proxy, finest first.
    pub fn proxy_labels(&self) -> &Labels {
        &self.proxy_labels
    }

    /// The scale and one finite, non-negative margin per level of `labels` (and of the
    /// proxies).
    fn check(&self, labels: &Labels) -> Result<()> {
        positive("scale", self.scale)?;
        check_margins(&self.margins, "margins")?;
        let (levels, proxy_levels) = (labels.num_levels(), self.proxy_labels.num_levels());
        if levels != proxy_levels {
            return Err(Error::Shape(format!(
                "the labels have {levels} levels but the proxies' labels {proxy_levels}"
            )));
        }
        check_margin_count(self.margins.len(), levels, "margins")
    }

    /// The proxy row of every item's fine class (column 0 of `labels`).
    fn targets(&self, labels: &Labels, device: &Device) -> Result<Tensor> {
        let mut targets = Vec::with_capacity(labels.len());
        for i in 0..labels.len() {
            let c = labels.fine(i);
            let row = self.index.get(&c).ok_or_else(|| {
                Error::invalid(
                    "labels",
                    format!(
                        "row {i}: class {c} has no proxy (the loss was built for {} other classes)",
                        self.proxy_labels.len()
                    ),
                )
            })?;
            targets.push(*row);
        }
        Ok(Tensor::from_vec(targets, (labels.len(), 1), device)?)
    }
}

impl RankLoss for Csl {
    /// The proxies, named `proxies`.
    fn trainable_vars(&self) -> Vec<(String, Var)> {
        vec![("proxies".into(), self.proxies.clone())]
    }

    /// `Σ_l mean_i softplus(LSE⁻_l(i) − s · s_{i,y_0(i)} + m_l · s)` (module documentation).
    /// Errors on an item whose fine class has no proxy, on labels with another number of levels
    /// than the proxies' or the margins', and on the usual bad batches.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        self.check(labels)?;
        let (b, d) = embeddings.dims2()?;
        let (c, pd) = self.proxies.dims2()?;
        if d != pd {
            return Err(Error::Shape(format!(
                "embeddings have dimension {d} but the proxies {pd}"
            )));
        }
        let device = embeddings.device();
        let v = l2_normalize(embeddings, "embeddings")?;
        let p = l2_normalize(self.proxies.as_tensor(), "proxies")?.to_dtype(v.dtype())?;
        // s · s_ic for every item and proxy (B × C): one product serves every level.
        let logits = (v.matmul(&p.t()?)? * self.scale)?;
        // s · s_{i,y_0(i)}: the own proxy is the one positive, LSE⁺ = −own.
        let own = logits.gather(&self.targets(labels, device)?, 1)?;
        let mut total: Option<Tensor> = None;
        for (l, &margin) in self.margins.iter().enumerate() {
            // Negatives: the proxies whose level-l class differs from the item's (B × C).
            let ids: Vec<ClassId> = (0..b).map(|i| labels.row(i)[l]).collect();
            let ids = Tensor::from_vec(ids, (b, 1), device)?;
            let neg = ids
                .broadcast_ne(&self.level_ids[l].to_device(device)?)?
                .to_dtype(logits.dtype())?;
            // Items whose level-l class holds every proxy have no negative (softplus(−∞) = 0).
            let empty: Vec<f64> = (0..b)
                .map(|i| {
                    let n = self.level_counts[l].get(&labels.row(i)[l]).copied();
                    f64::from(u8::from(n == Some(c)))
                })
                .collect();
            let empty = Tensor::from_vec(empty, (b, 1), device)?.to_dtype(logits.dtype())?;
            let lse = masked_logsumexp(&logits, &neg, &empty, self.scale)?;
            let x = ((lse - &own)? + margin * self.scale)?;
            // The items without a negative add exactly 0 and no gradient (their x is finite but
            // meaningless).
            let kept = (softplus(&x)? * (1.0 - empty)?)?;
            let term = (kept.sum_all()? / b as f64)?;
            total = Some(match total {
                None => term,
                Some(t) => (t + term)?,
            });
        }
        total.ok_or_else(|| Error::invalid("margins", "no label level"))
    }
}

/// `log Σ_c mask_ic · exp(z_ic)` per row of `z` (`B × C`, entries in `[−bound, bound]`) for a
/// 0 / 1 `mask`, as `B × 1`; rows flagged in `empty` (no 1 in their mask) get 0 instead of −∞.
/// Shifted by each row's largest masked entry (detached: the log-sum-exp does not depend on the
/// shift), so that no exponential overflows or underflows to a zero sum, and every masked-out
/// entry goes through `exp(0)` times 0, so that no NaN reaches the gradient.
fn masked_logsumexp(z: &Tensor, mask: &Tensor, empty: &Tensor, bound: f64) -> Result<Tensor> {
    // Masked-out entries sit at −(2·bound + 1), below every entry, so the maximum is a masked
    // entry's whenever the row has one; a row without one is shifted by 0.
    let below = ((mask - 1.0)? * (2.0 * bound + 1.0))?;
    let shift = ((z.detach() * mask)? + below)?.max_keepdim(1)?;
    let shift = (shift * (1.0 - empty)?)?;
    let shifted = (z.broadcast_sub(&shift)? * mask)?;
    let sum = ((shifted.exp()? * mask)?.sum_keepdim(1)? + empty)?;
    Ok((sum.log()? + shift)?)
}

/// `softplus(x) = log(1 + eˣ) = max(x, 0) + log(1 + e^{−|x|})`, the second form finite for any
/// finite `x`.
fn softplus(x: &Tensor) -> Result<Tensor> {
    Ok((x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?)
}

/// Every margin finite and ≥ 0 (`field` names them in the error).
fn check_margins(margins: &[f64], field: &str) -> Result<()> {
    if margins.is_empty() {
        return Err(Error::invalid(field, "give one margin per label level"));
    }
    if let Some((l, m)) = margins
        .iter()
        .enumerate()
        .find(|(_, m)| !m.is_finite() || **m < 0.0)
    {
        return Err(Error::invalid(
            field,
            format!("the margin of level {l} must be finite and ≥ 0, got {m}"),
        ));
    }
    Ok(())
}

/// One margin per label level (`field` names them in the error).
fn check_margin_count(margins: usize, levels: usize, field: &str) -> Result<()> {
    if margins == levels {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!(
                "{margins} margins for {levels} label levels: give one per level, finest first"
            ),
        ))
    }
}

/// CSL's recipe (`[loss] kind = "csl"`, `scale`, `margins`): the proxies are drawn for the run's
/// fine training classes from the run's seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CslConfig {
    /// The scale `s` (the authors': 32).
    pub scale: f64,
    /// One margin per label level, finest first. Left out (the default, and then absent from the
    /// recipe text): [`Csl::paper_margins`] for the training labels' number of levels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub margins: Option<Vec<f64>>,
}

impl Default for CslConfig {
    fn default() -> Self {
        CslConfig {
            scale: Csl::PAPER_SCALE,
            margins: None,
        }
    }
}

impl CslConfig {
    /// The loss for a run: one proxy per fine training class (f32, on the run's device), drawn
    /// from the run's seed, with this recipe's scale and margins. Errors, naming `loss.margins`,
    /// when the margins do not number the training labels' levels.
    pub fn loss(&self, ctx: &LossContext<'_>) -> Result<Csl> {
        let levels = ctx.train_labels.num_levels();
        let margins = match &self.margins {
            Some(m) => {
                check_margin_count(m.len(), levels, "loss.margins")?;
                m.clone()
            }
            None => Csl::paper_margins(levels).map_err(|e| match e {
                Error::Invalid { msg, .. } => Error::invalid("loss.margins", msg),
                other => other,
            })?,
        };
        let mut csl = Csl::new(ctx.train_labels, ctx.dim, ctx.seed, DType::F32, ctx.device)?;
        csl.scale = self.scale;
        csl.margins = margins;
        Ok(csl)
    }
}

impl LossRecipe for CslConfig {
    fn name(&self) -> String {
        "csl".into()
    }

    fn validate(&self) -> Result<()> {
        positive("scale", self.scale)?;
        match &self.margins {
            Some(m) => check_margins(m, "loss.margins"),
            None => Ok(()),
        }
    }

    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.loss(ctx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::{max_abs_diff, value_and_grad, LossConfig};

    const D: usize = 3;

    /// Five proxies, two levels: fine classes 0–4, coarse classes 10 = {0, 1}, 11 = {2, 3}
    /// and 12 = {4}.
    fn proxy_labels() -> Labels {
        Labels::new(vec![
            vec![0, 10],
            vec![1, 10],
            vec![2, 11],
            vec![3, 11],
            vec![4, 12],
        ])
        .unwrap()
    }

    fn csl(seed: u64) -> Csl {
        let mut csl = Csl::new(&proxy_labels(), D, seed, DType::F64, &Device::Cpu).unwrap();
        // A small scale keeps every term away from softplus's flat ends, so that the checks
        // see the whole formula.
        csl.scale = 3.0;
        csl
    }

    /// A batch of `labels.len()` rows of dimension `D`, not normalised.
    fn embeddings(n: usize, seed: u64) -> Tensor {
        let values: Vec<f64> = (0..n * D)
            .map(|k| ((k as f64 + 1.0) * (seed as f64 + 1.7)).sin() * 2.0)
            .collect();
        Tensor::from_vec(values, (n, D), &Device::Cpu).unwrap()
    }

    fn batch_labels() -> Labels {
        Labels::new(vec![vec![0, 10], vec![3, 11], vec![4, 12], vec![1, 10]]).unwrap()
    }

    fn rows(t: &Tensor) -> Vec<Vec<f64>> {
        t.to_vec2::<f64>().unwrap()
    }

    fn unit(r: &[f64]) -> Vec<f64> {
        let n = r.iter().map(|x| x * x).sum::<f64>().sqrt();
        r.iter().map(|x| x / n).collect()
    }

    /// The formula of the module documentation, in f64 loops.
    fn reference(loss: &Csl, x: &Tensor, labels: &Labels) -> f64 {
        let (xs, ps) = (rows(x), rows(loss.proxies().as_tensor()));
        let pl = loss.proxy_labels();
        let s = loss.scale;
        let mut total = 0.0;
        for (l, m) in loss.margins.iter().enumerate() {
            let mut sum = 0.0;
            for (i, xi) in xs.iter().enumerate() {
                let v = unit(xi);
                let cos: Vec<f64> = ps
                    .iter()
                    .map(|p| unit(p).iter().zip(&v).map(|(a, b)| a * b).sum())
                    .collect();
                let own = (0..pl.len())
                    .find(|&c| pl.fine(c) == labels.fine(i))
                    .unwrap();
                let neg: f64 = (0..pl.len())
                    .filter(|&c| pl.row(c)[l] != labels.row(i)[l])
                    .map(|c| (s * cos[c]).exp())
                    .sum();
                if neg > 0.0 {
                    sum += (neg.ln() - s * cos[own] + m * s).exp().ln_1p();
                }
            }
            total += sum / xs.len() as f64;
        }
        total
    }

    #[test]
    fn hand_worked_value_of_three_embeddings_on_two_levels() {
        // Proxies on the axes of the plane (already unit): fine classes 0 and 1 in coarse
        // class 10, fine class 2 in coarse class 11. s = 4, margins 0.2 (fine) and 0.5 (coarse).
        let pl = Labels::new(vec![vec![0, 10], vec![1, 10], vec![2, 11]]).unwrap();
        let p = Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0], [-1.0, 0.0]], &Device::Cpu).unwrap();
        let mut loss = Csl::with_proxies(&pl, Var::from_tensor(&p).unwrap()).unwrap();
        loss.scale = 4.0;
        loss.margins = vec![0.2, 0.5];
        // Item 0 (class 0) on proxy 0; item 1 (class 1) at 45° between proxies 0 and 1 (not
        // normalised: the loss normalises it); item 2 (class 2) on proxy 1.
        let x = Tensor::new(&[[2.0f64, 0.0], [1.0, 1.0], [0.0, 0.5]], &Device::Cpu).unwrap();
        let y = Labels::new(vec![vec![0, 10], vec![1, 10], vec![2, 11]]).unwrap();
        let got = loss.forward(&x, &y).unwrap().to_scalar::<f64>().unwrap();
        let sp = |x: f64| x.exp().ln_1p();
        let r = std::f64::consts::FRAC_1_SQRT_2;
        // Cosines with proxies (0, 1, 2): item 0 (1, 0, −1), item 1 (r, r, −r), item 2 (0, 1, 0).
        // Fine level, negatives = the other two proxies.
        let fine = [
            sp(((0.0f64).exp() + (-4.0f64).exp()).ln() - 4.0 + 0.8),
            sp(((4.0 * r).exp() + (-4.0 * r).exp()).ln() - 4.0 * r + 0.8),
            sp(((0.0f64).exp() + (4.0f64).exp()).ln() - 0.0 + 0.8),
        ];
        // Coarse level: items 0 and 1 (class 10) against proxy 2; item 2 (class 11) against
        // proxies 0 and 1.
        let coarse = [
            sp(-4.0 - 4.0 + 2.0),
            sp(-4.0 * r - 4.0 * r + 2.0),
            sp(((0.0f64).exp() + (4.0f64).exp()).ln() - 0.0 + 2.0),
        ];
        let want = fine.iter().sum::<f64>() / 3.0 + coarse.iter().sum::<f64>() / 3.0;
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        assert!((got - reference(&loss, &x, &y)).abs() < 1e-12);
    }

    #[test]
    fn equals_the_formula_on_a_random_batch() {
        let loss = csl(7);
        assert_eq!(loss.margins, vec![0.25, 0.45]);
        let (x, y) = (embeddings(4, 1), batch_labels());
        let got = loss.forward(&x, &y).unwrap().to_scalar::<f64>().unwrap();
        let want = reference(&loss, &x, &y);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        // The default scale, where the terms saturate: still the formula.
        let mut sharp = loss.clone();
        sharp.scale = Csl::PAPER_SCALE;
        let got = sharp.forward(&x, &y).unwrap().to_scalar::<f64>().unwrap();
        let want = reference(&sharp, &x, &y);
        assert!(
            (got - want).abs() < 1e-10 * want.max(1.0),
            "{got} vs {want}"
        );
    }

    /// Central differences of `f` at `x` against `grad`, coordinate by coordinate.
    fn check_against_finite_differences(f: impl Fn(&Tensor) -> f64, x: &Tensor, grad: &[Vec<f64>]) {
        let base = rows(x);
        let eps = 1e-6;
        for (r, row) in base.iter().enumerate() {
            for k in 0..row.len() {
                let at = |delta: f64| {
                    let mut m = base.clone();
                    m[r][k] += delta;
                    let flat: Vec<f64> = m.concat();
                    f(&Tensor::from_vec(flat, x.dims2().unwrap(), &Device::Cpu).unwrap())
                };
                let fd = (at(eps) - at(-eps)) / (2.0 * eps);
                let g = grad[r][k];
                assert!(
                    (fd - g).abs() < 1e-6 * g.abs().max(1.0),
                    "({r}, {k}): finite difference {fd} vs gradient {g}"
                );
            }
        }
        assert!(
            grad.iter().flatten().any(|g| g.abs() > 1e-4),
            "zero gradient"
        );
    }

    #[test]
    fn gradients_match_finite_differences_for_embeddings_and_proxies() {
        let loss = csl(3);
        let (x, y) = (embeddings(4, 2), batch_labels());
        let value = |e: &Tensor| loss.forward(e, &y).unwrap().to_scalar::<f64>().unwrap();
        let (_, grad) = value_and_grad(|e| loss.forward(e, &y), &x);
        check_against_finite_differences(value, &x, &grad);

        // With respect to the proxies, through `Var::set`.
        let l = loss.forward(&x, &y).unwrap();
        let gp = rows(l.backward().unwrap().get(loss.proxies()).unwrap());
        let w = loss.proxies().as_tensor().copy().unwrap();
        let at = |p: &Tensor| {
            loss.proxies().set(p).unwrap();
            value(&x)
        };
        check_against_finite_differences(at, &w, &gp);
        loss.proxies().set(&w).unwrap();
    }

    #[test]
    fn a_level_without_negatives_adds_nothing_and_keeps_the_gradient_finite() {
        // Every proxy in coarse class 7: no item has a negative at level 1.
        let pl = Labels::new(vec![vec![0, 7], vec![1, 7], vec![2, 7]]).unwrap();
        let two = Csl::new(&pl, D, 5, DType::F64, &Device::Cpu).unwrap();
        let y = Labels::new(vec![vec![0, 7], vec![2, 7], vec![1, 7]]).unwrap();
        let x = embeddings(3, 4);
        let (v, g) = value_and_grad(|e| two.forward(e, &y), &x);
        assert!(v.is_finite() && v > 0.0, "{v}");
        assert!(g.iter().flatten().all(|g| g.is_finite()), "{g:?}");
        // The fine level alone, with the same fine margin: the coarse level added exactly 0.
        let mut one_level = Csl::with_proxies(
            &Labels::from_fine(&[0, 1, 2]).unwrap(),
            two.proxies().clone(),
        )
        .unwrap();
        one_level.margins = vec![two.margins[0]];
        let y0 = Labels::from_fine(&[0, 2, 1]).unwrap();
        let (v0, g0) = value_and_grad(|e| one_level.forward(e, &y0), &x);
        assert!((v - v0).abs() < 1e-15, "{v} vs {v0}");
        assert!(max_abs_diff(&g, &g0) < 1e-15);
        // Every level without a negative (one fine class): the loss is 0, its gradient 0.
        let lone = Csl::new(
            &Labels::new(vec![vec![3, 7]]).unwrap(),
            D,
            0,
            DType::F64,
            &Device::Cpu,
        )
        .unwrap();
        let y = Labels::new(vec![vec![3, 7]; 2]).unwrap();
        let (v, g) = value_and_grad(|e| lone.forward(e, &y), &embeddings(2, 1));
        assert_eq!(v, 0.0);
        assert!(g.iter().flatten().all(|g| *g == 0.0), "{g:?}");
    }

    #[test]
    fn margins_follow_the_authors_and_their_count_must_match_the_levels() {
        assert_eq!(Csl::paper_margins(2).unwrap(), vec![0.25, 0.45]);
        assert_eq!(Csl::paper_margins(3).unwrap(), vec![0.25, 0.35, 0.45]);
        assert_eq!(
            Csl::paper_margins(7).unwrap(),
            vec![0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75]
        );
        assert_eq!(
            Csl::paper_margins(6).unwrap(),
            vec![0.15, 0.25, 0.35, 0.45, 0.55, 0.65]
        );
        assert_eq!(Csl::paper_margins(1).unwrap(), vec![0.25]);
        let e = Csl::paper_margins(8).unwrap_err().to_string();
        assert!(e.contains("margins") && e.contains("8 levels"), "{e}");

        // A recipe naming three margins for two-level training labels.
        let train = proxy_labels();
        let device = Device::Cpu;
        let ctx = LossContext {
            train_labels: &train,
            dim: D,
            seed: 0,
            device: &device,
        };
        let three = LossConfig::Csl(CslConfig {
            margins: Some(vec![0.25, 0.35, 0.45]),
            ..CslConfig::default()
        });
        let e = three.build(&ctx).err().unwrap().to_string();
        assert!(
            e.contains("loss.margins") && e.contains("3 margins for 2 label levels"),
            "{e}"
        );
        // Eight levels without margins: the recipe must give them.
        let deep = Labels::new(vec![(0..8).collect(), (8..16).collect()]).unwrap();
        let e = LossConfig::Csl(CslConfig::default())
            .build(&LossContext {
                train_labels: &deep,
                ..ctx.clone()
            })
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("loss.margins"), "{e}");
        // Invalid values are named.
        for bad in [vec![0.25, f64::NAN], vec![-0.1, 0.45], vec![]] {
            let config = LossConfig::Csl(CslConfig {
                margins: Some(bad),
                ..CslConfig::default()
            });
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains("loss.margins"), "{e}");
        }
        let e = LossConfig::Csl(CslConfig {
            scale: 0.0,
            ..CslConfig::default()
        })
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("loss.scale"), "{e}");
        // The loss itself refuses labels of another depth than its margins.
        let mut loss = csl(0);
        let x = embeddings(4, 0);
        loss.margins = vec![0.25];
        let e = loss.forward(&x, &batch_labels()).unwrap_err().to_string();
        assert!(e.contains("1 margins for 2 label levels"), "{e}");
        let flat = Labels::from_fine(&[0, 3, 4, 1]).unwrap();
        assert!(csl(0).forward(&x, &flat).is_err());
        // And an item whose fine class has no proxy.
        let y = Labels::new(vec![vec![0, 10], vec![9, 10], vec![4, 12], vec![1, 10]]).unwrap();
        let e = csl(0).forward(&x, &y).unwrap_err().to_string();
        assert!(e.contains("row 1: class 9 has no proxy"), "{e}");
    }

    #[test]
    fn recipe_round_trips_through_toml_and_builds_one_proxy_per_fine_class() {
        #[derive(Serialize, Deserialize)]
        struct Wrapper {
            loss: LossConfig,
        }
        let default = LossConfig::Csl(CslConfig::default());
        let text = toml::to_string(&default).unwrap();
        assert_eq!(text, "kind = \"csl\"\nscale = 32.0\n");
        for config in [
            default,
            LossConfig::Csl(CslConfig {
                scale: 16.0,
                margins: Some(vec![0.2, 0.4]),
            }),
        ] {
            let text = toml::to_string(&Wrapper {
                loss: config.clone(),
            })
            .unwrap();
            let back: Wrapper = toml::from_str(&text).unwrap();
            assert_eq!(back.loss, config, "{text}");
        }
        let parsed: LossConfig = toml::from_str("kind = \"csl\"\nmargins = [0.1, 0.2]\n").unwrap();
        assert_eq!(
            parsed,
            LossConfig::Csl(CslConfig {
                scale: 32.0,
                margins: Some(vec![0.1, 0.2]),
            })
        );
        assert!(toml::from_str::<LossConfig>("kind = \"csl\"\nmargin = 0.1\n").is_err());

        // Built for training labels with repeated items: one proxy per fine class, in
        // increasing id order, in the loss's parameter group, seeded.
        let train = Labels::new(vec![
            vec![4, 12],
            vec![0, 10],
            vec![4, 12],
            vec![2, 11],
            vec![0, 10],
        ])
        .unwrap();
        let device = Device::Cpu;
        let ctx = LossContext {
            train_labels: &train,
            dim: 8,
            seed: 3,
            device: &device,
        };
        let loss = CslConfig::default().loss(&ctx).unwrap();
        assert_eq!(loss.proxy_labels().column(0), vec![0, 2, 4]);
        assert_eq!(loss.proxy_labels().column(1), vec![10, 11, 12]);
        assert_eq!(loss.margins, vec![0.25, 0.45]);
        assert_eq!(loss.proxies().dims(), &[3, 8]);
        assert_eq!(loss.proxies().dtype(), DType::F32);
        let vars = loss.trainable_vars();
        assert_eq!(vars.len(), 1);
        assert_eq!(vars[0].0, "proxies");
        let again = CslConfig::default().loss(&ctx).unwrap();
        let bits = |c: &Csl| c.proxies().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(bits(&loss), bits(&again));
        let bound = 1.0 / (8f32).sqrt();
        assert!(bits(&loss).iter().all(|v| v.abs() < bound));
        // f32 embeddings give a finite f32 loss.
        let x = Tensor::randn(0f32, 1.0, (5, 8), &device).unwrap();
        let v = loss.forward(&x, &train).unwrap();
        assert_eq!(v.dtype(), DType::F32);
        assert!(v.to_scalar::<f32>().unwrap().is_finite());
    }
}

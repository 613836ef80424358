//! FastAP (Cakir, He, Xia, Kulis, Sclaroff, "Deep Metric Learning to Rank", CVPR 2019): AP as
//! the area under the precision–recall curve of the distance histogram, with soft
//! (triangular-kernel) binning so that it has useful gradients.
//!
//! For a query `q` with `N⁺` positives, distances `d = ‖ê_q − ê_j‖² = 2 − 2 ê_q·ê_j ∈ [0, 4]` to
//! every other item of the batch are spread over the bin centres `z_l = 4l/L` (`l = 0..=L`,
//! `L = num_bins`, width `Δ = 4/L`) with the kernel `δ(d, z_l) = max(0, 1 − |d − z_l|/Δ)`.
//! With `h⁺_l`, `h⁻_l` the soft counts of positives and negatives in bin `l` and `H⁺_l`, `H_l`
//! the cumulative counts of positives and of all items,
//!
//! `FastAP_q = (1/N⁺) Σ_l h⁺_l H⁺_l / H_l` (poster: `AP ≈ (1/N⁺) Σ_z H⁺_z h⁺_z / H_z`),
//!
//! and the loss is `1 − mean_q FastAP_q` over the queries that have a positive (the minibatch
//! mAP of the poster; `pytorch/FastAP_loss.py`, pytorch-metric-learning's `FastAPLoss`, ROADMAP
//! and SupRank all compute this value).
//!
//! **Bins.** The poster's "L bins" are the code's `num_bins` intervals: `num_bins = 10` gives 11
//! centres `{0, 0.4, …, 4}` and `Δ = 0.4` (authors' default). Set `num_bins = L − 1` for `L`
//! centres.
//!
//! **Conventions of the authors' code kept here.** The query is not in its own retrieval set
//! (the diagonal is masked); terms with an empty cumulative histogram (`H_l = 0`) count 0; a
//! query without positives is left out of the mean (a documented zero contribution). A batch
//! where *no* query has a positive is an error, not a silent 0.
//!
//! **Gradient.** The default is the exact gradient of the loss above (what autograd gives in
//! pytorch-metric-learning/ROADMAP/SupRank), computed analytically per query row in `O(B)`
//! (each distance falls in at most two bins), in query chunks. At a distance exactly on a bin
//! centre the kernel's derivative is taken as 0, the subgradient torch's autograd of `|·|`
//! uses. [`FastApGradient::AuthorsPort`] reproduces the hand-written backward of the authors'
//! PyTorch port instead: `N_valid/2` times the exact gradient (it does not average over the
//! queries, drops the factor 2 of `d(2 − 2xᵀy)/dx`), its one-sided kernel derivative
//! `dSoftBinning` at bin centres and edges, and — with `normalize = false`, as the port takes
//! the already-normalised embeddings — its radial gradient component. The port also ignores
//! the incoming gradient (loss weights have no effect there); here it is always applied.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::config::{LossContext, LossRecipe};
use crate::losses::pairwise_rows::{
    check_unit_rows, chunk_size, fine_ids, row_loss, Input, RowLoss,
};
use crate::losses::{check_batch, l2_normalize, pair_masks, RankLoss};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub mod device;

/// Which gradient [`FastAp`] returns (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FastApGradient {
    /// The true gradient of `1 − mean_q FastAP_q` (paper's objective; what autograd gives).
    #[default]
    Exact,
    /// The hand-written backward of `kunhe/FastAP-metric-learning/pytorch/FastAP_loss.py`:
    /// `N_valid/2` × the exact gradient, with its one-sided kernel derivative.
    AuthorsPort,
}

/// The FastAP loss (Cakir et al., CVPR 2019, poster formula; code `FastAP_loss.py`).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{fastap::FastAp, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // Squared distances 2 − 2s: the positives sit at 0.4, a bin centre of the default 10 bins,
/// // and the one negative ranked above them (d13 = 0.08) falls wholly below their bin, so each
/// // query's FastAP is its AP here: 1 − mAP = 0.25.
/// let loss = FastAp::default().forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((loss - 0.25).abs() < 1e-9);
/// # Ok::<(), rankwise::Error>(())
/// ```
///
/// The struct is its own recipe (`[loss] kind = "fast_ap"`, `num_bins`, `authors_gradient`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FastAp {
    /// Number of histogram intervals over `[0, 4]` (the code's `num_bins`; `num_bins + 1` bin
    /// centres). Authors' default 10; Smooth-AP's FastAP baseline on iNat used 20.
    pub num_bins: usize,
    /// L2-normalise the embeddings inside the loss (pytorch-metric-learning's `LpDistance`
    /// does). With `false` the embeddings are used as given, as the authors' port does; they
    /// must then have unit norm (checked to 1e-4).
    #[serde(skip)]
    pub normalize: bool,
    /// Exact gradient (default) or the authors' port's scaling; a recipe writes
    /// `authors_gradient = true` for the latter.
    #[serde(rename = "authors_gradient", with = "authors_gradient")]
    pub gradient: FastApGradient,
    /// Queries per chunk (`None`: the whole batch at once). Working set `O(chunk × B)`.
    #[serde(skip)]
    pub query_chunk: Option<usize>,
}

/// The recipe's `authors_gradient = true | false` for [`FastApGradient`].
mod authors_gradient {
    use super::FastApGradient;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(g: &FastApGradient, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(*g == FastApGradient::AuthorsPort)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FastApGradient, D::Error> {
        Ok(if bool::deserialize(d)? {
            FastApGradient::AuthorsPort
        } else {
            FastApGradient::Exact
        })
    }
}

impl Default for FastAp {
    /// The authors' defaults: 10 bins, exact gradient, whole batch in one chunk.
    fn default() -> Self {
        FastAp {
            num_bins: 10,
            normalize: true,
            gradient: FastApGradient::Exact,
            query_chunk: None,
        }
    }
}

/// The bin centres and width of FastAP's soft histogram over squared distances in `[0, 4]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bins {
    delta: f64,
    /// `L/4`, for [`Bins::window`] only (the kernel keeps the division of the formula).
    inv_delta: f64,
    centres: Vec<f64>,
}

impl Bins {
    /// `num_bins` intervals of width `Δ = 4/num_bins` and `num_bins + 1` centres `4l/num_bins`
    /// (`torch.linspace(0, 4, num_bins + 1)`).
    pub fn new(num_bins: usize) -> Result<Self> {
        if num_bins == 0 {
            return Err(Error::invalid("num_bins", "must be at least 1"));
        }
        let centres = (0..=num_bins)
            .map(|l| 4.0 * l as f64 / num_bins as f64)
            .collect();
        Ok(Bins {
            delta: 4.0 / num_bins as f64,
            inv_delta: num_bins as f64 / 4.0,
            centres,
        })
    }

    /// Number of bin centres (`num_bins + 1`).
    pub fn len(&self) -> usize {
        self.centres.len()
    }

    /// Always false: there is at least one interval.
    pub fn is_empty(&self) -> bool {
        self.centres.is_empty()
    }

    /// The triangular kernel `δ(d, z_l) = max(0, 1 − |d − z_l|/Δ)`.
    pub fn kernel(&self, d: f64, l: usize) -> f64 {
        let gap = (d - self.centres[l]).abs();
        // The same value without the division where it is 0: a correctly rounded `gap / Δ` is
        // ≥ 1 exactly when `gap ≥ Δ`. Divisions dominated the per-row work of the loss.
        if gap >= self.delta {
            return 0.0;
        }
        (1.0 - gap / self.delta).max(0.0)
    }

    /// `∂δ(d, z_l)/∂d` as torch's autograd computes it: `−sign(d − z_l)/Δ` where the kernel is
    /// positive, with `sign(0) = 0`; 0 elsewhere.
    pub fn kernel_slope(&self, d: f64, l: usize) -> f64 {
        let z = self.centres[l];
        // The kernel is positive exactly where `|d − z| < Δ` (a correctly rounded `gap/Δ` is
        // below 1 for every gap below Δ), so no division is needed to tell.
        if (d - z).abs() < self.delta {
            if d > z {
                -1.0 / self.delta
            } else if d < z {
                1.0 / self.delta
            } else {
                0.0
            }
        } else {
            0.0
        }
    }

    /// The authors' port's `dSoftBinning`: `+1/Δ` on `(z_l − Δ, z_l]`, `−1/Δ` on
    /// `(z_l, z_l + Δ]`, 0 elsewhere.
    pub fn port_kernel_slope(&self, d: f64, l: usize) -> f64 {
        let z = self.centres[l];
        let rising = d > z - self.delta && d <= z;
        let falling = d > z && d <= z + self.delta;
        (rising as u8 as f64 - falling as u8 as f64) / self.delta
    }

    /// The bins whose kernel (or the port's derivative) can be non-zero at `d`: a window of
    /// four centres around `d`, which contains the two that matter.
    fn window(&self, d: f64) -> std::ops::Range<usize> {
        // ⌊d/Δ⌋ without `f64::floor`, which is a libm call on the baseline x86-64 target and
        // showed in the loss's profile; identical for every finite d (distances of unit vectors
        // lie in [−ε, 4 + ε]). `d · (1/Δ)` instead of `d/Δ` (one of the three divisions per
        // pair in the summaries, the only one in the gradient rows): it differs by at most an
        // ulp, which moves ⌊·⌋ only next to a centre, where the two bins that matter still lie
        // inside the window of four.
        let t = d * self.inv_delta;
        let trunc = t as i64;
        let idx = if (trunc as f64) > t { trunc - 1 } else { trunc };
        let last = self.centres.len() as i64 - 1;
        let lo = (idx - 1).clamp(0, last) as usize;
        let hi = (idx + 2).clamp(0, last) as usize;
        lo..hi + 1
    }
}

/// Soft histograms of one query: positive and negative counts per bin (FastAP `h⁺`, `h⁻`).
#[derive(Debug, Clone, PartialEq)]
pub struct QueryHistograms {
    /// `h⁺_l`.
    pub pos: Vec<f64>,
    /// `h⁻_l`.
    pub neg: Vec<f64>,
    /// Number of positives `N⁺`.
    pub num_pos: usize,
}

impl QueryHistograms {
    /// Builds `h⁺`, `h⁻` from the squared distances of the retrieval set and whether each item is
    /// a positive.
    pub fn new(dists: &[f64], positive: &[bool], bins: &Bins) -> Self {
        Self::from_items(dists.iter().copied().zip(positive.iter().copied()), bins)
    }

    /// [`QueryHistograms::new`] from `(squared distance, is positive)` pairs, in order.
    fn from_items(items: impl Iterator<Item = (f64, bool)>, bins: &Bins) -> Self {
        let mut pos = vec![0.0; bins.len()];
        let mut neg = vec![0.0; bins.len()];
        let mut num_pos = 0;
        for (d, p) in items {
            num_pos += p as usize;
            let hist = if p { &mut pos } else { &mut neg };
            for l in bins.window(d) {
                hist[l] += bins.kernel(d, l);
            }
        }
        QueryHistograms { pos, neg, num_pos }
    }

    /// Cumulative positives `H⁺_l` and cumulative items `H_l`.
    fn cumulative(&self) -> (Vec<f64>, Vec<f64>) {
        let mut cum_pos = Vec::with_capacity(self.pos.len());
        let mut cum_all = Vec::with_capacity(self.pos.len());
        let (mut hp, mut h) = (0.0, 0.0);
        for (p, n) in self.pos.iter().zip(&self.neg) {
            hp += p;
            h += p + n;
            cum_pos.push(hp);
            cum_all.push(h);
        }
        (cum_pos, cum_all)
    }

    /// `FastAP = (1/N⁺) Σ_l h⁺_l H⁺_l / H_l` (terms with `h⁺_l H⁺_l = 0` or `H_l = 0` count 0);
    /// `None` without positives.
    pub fn fastap(&self) -> Option<f64> {
        if self.num_pos == 0 {
            return None;
        }
        let (cum_pos, cum_all) = self.cumulative();
        let mut sum = 0.0;
        for l in 0..self.pos.len() {
            let num = self.pos[l] * cum_pos[l];
            if num > 0.0 && cum_all[l] > 0.0 {
                sum += num / cum_all[l];
            }
        }
        Some(sum / self.num_pos as f64)
    }

    /// `(∂FastAP/∂h⁺_l, ∂FastAP/∂h⁻_l)` for every bin (the code's `d_AP_h_pos`, `d_AP_h_neg`):
    /// `∂/∂h⁺_l = (1/N⁺)[H⁺_l/H_l + Σ_{k≥l} h⁺_k H⁻_k / H_k²]`,
    /// `∂/∂h⁻_l = −(1/N⁺) Σ_{k≥l} h⁺_k H⁺_k / H_k²`; terms with `H = 0` count 0.
    pub fn fastap_partials(&self) -> (Vec<f64>, Vec<f64>) {
        let bins = self.pos.len();
        let mut d_pos = vec![0.0; bins];
        let mut d_neg = vec![0.0; bins];
        if self.num_pos == 0 {
            return (d_pos, d_neg);
        }
        let (cum_pos, cum_all) = self.cumulative();
        let inv_n = 1.0 / self.num_pos as f64;
        // Suffix sums over k ≥ l, accumulated from the last bin down.
        let (mut tail_pos, mut tail_neg) = (0.0, 0.0);
        for l in (0..bins).rev() {
            let h2 = cum_all[l] * cum_all[l];
            if h2 > 0.0 {
                let cum_neg = cum_all[l] - cum_pos[l];
                tail_pos += self.pos[l] * cum_neg / h2;
                tail_neg += self.pos[l] * cum_pos[l] / h2;
            }
            let ratio = if cum_all[l] > 0.0 {
                cum_pos[l] / cum_all[l]
            } else {
                0.0
            };
            d_pos[l] = inv_n * (ratio + tail_pos);
            d_neg[l] = -inv_n * tail_neg;
        }
        (d_pos, d_neg)
    }
}

/// FastAP of one query from its squared distances to the retrieval set (query excluded) and
/// the positive flags; `None` without positives.
pub fn fastap_of_query(dists: &[f64], positive: &[bool], num_bins: usize) -> Result<Option<f64>> {
    let bins = Bins::new(num_bins)?;
    Ok(QueryHistograms::new(dists, positive, &bins).fastap())
}

impl FastAp {
    /// The loss as plain candle tensor expressions, its gradient by autograd: the module
    /// documentation's formula as written, on any device, with a `B × B × (L + 1)` soft
    /// histogram. [`RankLoss::forward`] computes the same value and (exact) gradient row by
    /// row in `O(B)` per query (tested equal); [`FastApGradient::AuthorsPort`] has no plain
    /// counterpart, as it is not the gradient of a formula.
    pub fn forward_plain(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        LossRecipe::validate(self)?;
        let x = if self.normalize {
            l2_normalize(embeddings, "embeddings")?
        } else {
            check_unit_rows(embeddings, 1e-4)?;
            embeddings.clone()
        };
        let (dtype, device) = (x.dtype(), x.device());
        let l = self.num_bins;
        let width = 4.0 / l as f64;
        // d = ‖ê_q − ê_j‖² = 2 − 2 ê_q·ê_j, and δ(d, z_l) = max(0, 1 − |d − z_l|/Δ).
        let d = x.matmul(&x.t()?)?.affine(-2.0, 2.0)?;
        let centres: Vec<f64> = (0..=l).map(|k| 4.0 * k as f64 / l as f64).collect();
        let centres = Tensor::from_vec(centres, (1, 1, l + 1), device)?.to_dtype(dtype)?;
        let kernel = ((d.unsqueeze(2)?.broadcast_sub(&centres)?.abs()? / width)?)
            .affine(-1.0, 1.0)?
            .relu()?;
        // h⁺_l, h⁻_l per query (the query itself in neither), and the cumulative H⁺_l, H_l.
        let (pos, neg) = pair_masks(labels, dtype, device)?;
        let h_pos = kernel.broadcast_mul(&pos.unsqueeze(2)?)?.sum(1)?;
        let h_neg = kernel.broadcast_mul(&neg.unsqueeze(2)?)?.sum(1)?;
        let cum_pos = h_pos.cumsum(1)?;
        let cum_all = (&h_pos + &h_neg)?.cumsum(1)?;
        // A bin with H_l = 0 has h⁺_l = 0 and counts 0: divide by 1 there instead.
        let empty = cum_all.le(0.0)?.to_dtype(dtype)?;
        let terms = ((h_pos * cum_pos)? / (cum_all + empty)?)?;
        // FastAP_q = (1/N⁺) Σ_l h⁺_l H⁺_l / H_l over the queries with a positive.
        let n_pos = pos
            .to_dtype(candle_core::DType::F64)?
            .sum(1)?
            .to_vec1::<f64>()?;
        let valid: Vec<f64> = n_pos
            .iter()
            .map(|&n| f64::from(u8::from(n > 0.0)))
            .collect();
        let queries = valid.iter().sum::<f64>();
        if queries == 0.0 {
            return Err(Error::invalid(
                "labels",
                "no query of the batch has a positive (another item of its class)",
            ));
        }
        let weights: Vec<f64> = n_pos
            .iter()
            .zip(&valid)
            .map(|(&n, &v)| if v > 0.0 { 1.0 / (n * queries) } else { 0.0 })
            .collect();
        let weights = Tensor::from_vec(weights, (labels.len(), 1), device)?.to_dtype(dtype)?;
        let mean_fastap = terms.broadcast_mul(&weights)?.sum_all()?;
        Ok(mean_fastap.affine(-1.0, 1.0)?)
    }
}

impl LossRecipe for FastAp {
    fn name(&self) -> String {
        "fastap".into()
    }

    fn validate(&self) -> Result<()> {
        if self.num_bins == 0 {
            return Err(Error::invalid("loss.num_bins", "must be ≥ 1"));
        }
        Ok(())
    }

    fn build(&self, _: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        Ok(Box::new(self.clone()))
    }
}

impl RankLoss for FastAp {
    /// `1 − mean FastAP` over the queries with a positive (same fine class, query excluded).
    /// Normalises the embeddings unless `normalize` is false.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        // On a GPU: the histograms, values and gradient by kernels (see `device`).
        if device::applies(self, embeddings) {
            return device::forward(self, embeddings, labels);
        }
        let bins = Bins::new(self.num_bins)?;
        // Kernels off: on a device, the formula's `B × B × (L + 1)` histogram (tested equal to
        // the row engine); the authors' gradient has no plain counterpart.
        let b = labels.len();
        if self.gradient == FastApGradient::Exact
            && crate::losses::plain_on_device(
                embeddings,
                self.query_chunk,
                b * b * (self.num_bins + 1),
            )
        {
            return self.forward_plain(embeddings, labels);
        }
        let input = if self.normalize {
            Input::Normalise
        } else {
            check_unit_rows(embeddings, 1e-4)?;
            Input::AsGiven
        };
        let chunk = chunk_size(self.query_chunk, labels.len())?;
        let rows = FastApRows {
            bins,
            fine: fine_ids(labels),
            gradient: self.gradient,
        };
        Ok(row_loss(embeddings, input, rows, chunk)?.0)
    }
}

/// FastAP as a [`RowLoss`]: a row's summary is its FastAP and the partials of its histograms
/// (`None` without positives), so the backward pass does not rebuild the histograms.
struct FastApRows {
    bins: Bins,
    fine: Arc<Vec<ClassId>>,
    gradient: FastApGradient,
}

/// One query's FastAP and `(∂FastAP/∂h⁺_l, ∂FastAP/∂h⁻_l)`.
struct FastApRow {
    fastap: f64,
    d_pos: Vec<f64>,
    d_neg: Vec<f64>,
}

impl FastApRows {
    /// `(column, squared distance, is positive)` of query `q`'s retrieval set, in column order
    /// with the query's own column left out.
    fn retrieval_set<'a>(
        &'a self,
        q: usize,
        sims: &'a [f64],
    ) -> impl Iterator<Item = (usize, f64, bool)> + 'a {
        let fine_q = self.fine[q];
        sims.iter()
            .enumerate()
            .filter(move |&(j, _)| j != q)
            .map(move |(j, &s)| (j, 2.0 - 2.0 * s, self.fine[j] == fine_q))
    }
}

impl RowLoss for FastApRows {
    type Row = Option<FastApRow>;
    /// (number of queries with a positive, Σ FastAP over them)
    type Global = (usize, f64);

    fn summarise(&self, q: usize, sims: &[f64]) -> Option<FastApRow> {
        let items = self.retrieval_set(q, sims).map(|(_, d, p)| (d, p));
        let hist = QueryHistograms::from_items(items, &self.bins);
        let fastap = hist.fastap()?;
        let (d_pos, d_neg) = hist.fastap_partials();
        Some(FastApRow {
            fastap,
            d_pos,
            d_neg,
        })
    }

    fn global(&self, rows: &[Option<FastApRow>]) -> Result<(usize, f64)> {
        let valid: Vec<f64> = rows.iter().flatten().map(|r| r.fastap).collect();
        if valid.is_empty() {
            return Err(Error::invalid(
                "labels",
                "FastAP is undefined for this batch: no item shares its class with another \
                 item (every query lacks a positive)",
            ));
        }
        Ok((valid.len(), valid.iter().sum()))
    }

    fn value(&self, global: &(usize, f64)) -> f64 {
        1.0 - global.1 / global.0 as f64
    }

    fn row_grad(
        &self,
        q: usize,
        sims: &[f64],
        row: &Option<FastApRow>,
        global: &(usize, f64),
        upstream: f64,
        out: &mut [f64],
    ) {
        let Some(row) = row else {
            return;
        };
        // loss = 1 − (1/N_valid) Σ_q FastAP_q and d = 2 − 2s, so ∂loss/∂s = (2/N_valid) ∂FastAP/∂d;
        // the port returns N_valid/2 times that.
        let scale = match self.gradient {
            FastApGradient::Exact => 2.0 / global.0 as f64,
            FastApGradient::AuthorsPort => 1.0,
        };
        let bins = &self.bins;
        for (j, d, p) in self.retrieval_set(q, sims) {
            let partial = if p { &row.d_pos } else { &row.d_neg };
            let mut coeff = 0.0;
            for l in bins.window(d) {
                let slope = match self.gradient {
                    FastApGradient::Exact => bins.kernel_slope(d, l),
                    FastApGradient::AuthorsPort => bins.port_kernel_slope(d, l),
                };
                coeff += partial[l] * slope;
            }
            out[j] = upstream * scale * coeff;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::{max_abs_diff, value_and_grad};
    use candle_core::Device;

    /// The row engine (chunked or not, normalising or given unit rows) gives the plain
    /// formulation's value and exact gradient, for a few bin counts.
    #[test]
    fn row_engine_equals_the_plain_formulation() {
        let raw = Tensor::randn(0f64, 1.0, (13, 4), &Device::Cpu).unwrap();
        let unit = raw
            .broadcast_div(&raw.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap())
            .unwrap();
        // A singleton class (item 12): a query without positives, left out of the mean.
        let labels = Labels::from_fine(&[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 4, 5]).unwrap();
        for num_bins in [1, 4, 10, 25] {
            for (x, normalize) in [(&raw, true), (&unit, false)] {
                for query_chunk in [None, Some(4)] {
                    let loss = FastAp {
                        num_bins,
                        normalize,
                        gradient: FastApGradient::Exact,
                        query_chunk,
                    };
                    let (v, g) = value_and_grad(|e| loss.forward(e, &labels), x);
                    let (w, h) = value_and_grad(|e| loss.forward_plain(e, &labels), x);
                    assert!((v - w).abs() < 1e-12, "{loss:?}: {v} vs {w}");
                    let diff = max_abs_diff(&g, &h);
                    assert!(diff < 1e-10, "{loss:?}: gradients differ by {diff}");
                }
            }
        }
    }

    /// Exact AP of a list sorted by ascending distance (distinct distances).
    fn exact_ap(dists: &[f64], positive: &[bool]) -> f64 {
        let mut order: Vec<usize> = (0..dists.len()).collect();
        order.sort_by(|&a, &b| dists[a].total_cmp(&dists[b]));
        let (mut hits, mut sum) = (0.0, 0.0);
        for (rank, &i) in order.iter().enumerate() {
            if positive[i] {
                hits += 1.0;
                sum += hits / (rank + 1) as f64;
            }
        }
        sum / hits
    }

    #[test]
    fn bins_follow_the_authors_linspace() {
        let b = Bins::new(10).unwrap();
        assert_eq!(b.len(), 11);
        assert!((b.centres[1] - 0.4).abs() < 1e-15 && b.centres[10] == 4.0);
        assert!((b.kernel(0.5, 1) - 0.75).abs() < 1e-12);
        assert!((b.kernel(0.5, 2) - 0.25).abs() < 1e-12);
        assert_eq!(b.kernel(0.5, 3), 0.0);
        assert!(Bins::new(0).is_err());
        // Slopes: torch's sign(0) = 0 at the centre, the port's one-sided rule.
        assert_eq!(b.kernel_slope(0.8, 2), 0.0);
        assert_eq!(b.port_kernel_slope(0.8, 2), 2.5);
        assert_eq!(b.kernel_slope(0.5, 1), -2.5);
    }

    #[test]
    fn equals_exact_ap_when_distances_sit_on_bin_centres() {
        // Distances on multiples of 0.5 are exact bin centres for num_bins = 8, 16, 64, …: each
        // item puts its whole mass in one bin and FastAP is the exact AP, for every refinement.
        let dists = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 0.0];
        let positive = [true, false, true, true, false, false, false, true, false];
        let want = exact_ap(&dists, &positive);
        for bins in [8, 16, 64, 256] {
            let got = fastap_of_query(&dists, &positive, bins).unwrap().unwrap();
            assert!((got - want).abs() < 1e-14, "{bins} bins: {got} vs {want}");
        }
        // The Smooth-AP supp. B.1.6 list: positives at ranks 1, 3, 4, 8 → AP = 0.729167.
        let d = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
        let p = [true, false, true, true, false, false, false, true];
        let got = fastap_of_query(&d, &p, 8).unwrap().unwrap();
        assert!((got - (1.0 + 2.0 / 3.0 + 0.75 + 0.5) / 4.0).abs() < 1e-14);
    }

    #[test]
    fn hand_worked_soft_histogram() {
        // num_bins = 4 (Δ = 1, centres 0..4). One positive at d = 0.5, one negative at d = 0.25.
        // h⁺ = (0.5, 0.5, 0, 0, 0), h⁻ = (0.75, 0.25, 0, …); H⁺ = (0.5, 1, 1, …), H = (1.25, 2, 2, …).
        // FastAP = 0.5·0.5/1.25 + 0.5·1/2 = 0.2 + 0.25 = 0.45.
        let got = fastap_of_query(&[0.5, 0.25], &[true, false], 4)
            .unwrap()
            .unwrap();
        assert!((got - 0.45).abs() < 1e-15, "{got}");
        assert_eq!(fastap_of_query(&[0.5], &[false], 4).unwrap(), None);
    }

    #[test]
    fn partials_match_finite_differences_of_the_histogram_formula() {
        let hist = QueryHistograms {
            pos: vec![0.3, 0.2, 1.2, 0.5],
            neg: vec![0.1, 0.7, 0.4, 2.0],
            num_pos: 2,
        };
        let (d_pos, d_neg) = hist.fastap_partials();
        let eps = 1e-7;
        for l in 0..4 {
            for (which, analytic) in [(0, d_pos[l]), (1, d_neg[l])] {
                let mut plus = hist.clone();
                let mut minus = hist.clone();
                let (p, m) = if which == 0 {
                    (&mut plus.pos, &mut minus.pos)
                } else {
                    (&mut plus.neg, &mut minus.neg)
                };
                p[l] += eps;
                m[l] -= eps;
                let fd = (plus.fastap().unwrap() - minus.fastap().unwrap()) / (2.0 * eps);
                assert!((fd - analytic).abs() < 1e-7, "bin {l}: {fd} vs {analytic}");
            }
        }
    }

    #[test]
    fn window_holds_every_active_bin_and_slopes_need_no_division() {
        // Distances on a fine grid plus every centre and its ± ulp neighbours, and the centres
        // ± Δ (the kernel's edges), for several bin counts: the window must hold every bin
        // whose kernel or either slope is non-zero, and the slope must agree with its
        // definition through the kernel's value.
        for n in [3, 4, 10, 25, 64] {
            let b = Bins::new(n).unwrap();
            let mut ds: Vec<f64> = (0..=4000).map(|i| i as f64 * 1e-3 - 0.0005).collect();
            for &z in &b.centres {
                for base in [z, z - b.delta, z + b.delta] {
                    ds.extend([base, base.next_up(), base.next_down()]);
                }
            }
            for d in ds {
                let w = b.window(d);
                for l in 0..b.len() {
                    let k = b.kernel(d, l);
                    let via_kernel = if k > 0.0 {
                        let z = b.centres[l];
                        if d > z {
                            -1.0 / b.delta
                        } else if d < z {
                            1.0 / b.delta
                        } else {
                            0.0
                        }
                    } else {
                        0.0
                    };
                    assert_eq!(
                        b.kernel_slope(d, l),
                        via_kernel,
                        "{n} bins, d = {d}, l = {l}"
                    );
                    let active = k != 0.0 || via_kernel != 0.0 || b.port_kernel_slope(d, l) != 0.0;
                    assert!(
                        !active || w.contains(&l),
                        "{n} bins, d = {d}, l = {l}, {w:?}"
                    );
                }
            }
        }
    }
}

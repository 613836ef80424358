//! RaMBO (Rolínek, Musil, Paulus, Vlastelica, Michaelis, Martius, "Optimizing Rank-based
//! Metrics with Blackbox Differentiation", CVPR 2020): rank-based retrieval losses whose ranks
//! are differentiated with the blackbox interpolation of [`crate::losses::blackbox_rank`].
//!
//! For each query `q` of the batch, the *sequence* is the row of cosine similarities to the
//! batch items (the query itself removed, as the paper says, unless `include_self`, as
//! ROADMAP's and SupRank's `BlackBoxAP` keep it); an item is *relevant* when it shares the
//! query's fine class.
//!
//! * **Margin** (Eq. 14–15): relevant scores are shifted down by `α/2`, irrelevant ones up by
//!   `α/2`, before ranking: `rk_α(y) = rk(y − α(y* − ½))`. [`MarginMode::HalfNormal`] is the
//!   stochastic shift of `MapLoss`/`BlackBoxAP` (`α·|ξ|·(y* − ½)`, `ξ ~ N(0, 1)` per entry).
//! * **Ranks among the relevant items** `rk⁺` are constants (no gradient), as in the code.
//! * **AP loss** (Eq. 21–22): `Prec(i) = rk⁺_i / rk_i`, `L_AP = 1 − mean_{i relevant} Prec(i)`.
//! * **Recall loss** (Eq. 16–20): `r_i = rk_i − rk⁺_i` negatives ahead of positive `i`,
//!   `L_rec = mean_i ℓ(r_i)` with `ℓ(k) = log(1 + k)` ("log") or `log(1 + log(1 + k))`
//!   ("log log"), the closed forms of Eq. 19 with the weights of [`RecallWeight::weight`].
//! * **Averaging.** The paper computes the loss per query and averages (default,
//!   [`Averaging::PerQuery`]); `RecallLoss` in `blackbox-backprop/recall.py` pools every
//!   positive of every sequence (`sum / gt.sum()`, [`Averaging::PooledPositives`]).
//!   Sequences without a relevant item contribute nothing (they are left out of the mean; a
//!   batch where no sequence has one is an error).
//! * **Counting** `r_i`. The paper counts negatives ([`RecallCount::Exact`]); the code
//!   de-normalises `(rk − rk⁺)` by the number of *sequences* instead of their length
//!   ([`RecallCount::NumSequences`]), the same for a square batch without memory and
//!   `(τ + 1)` times larger with τ stored batches.
//! * **Score memory** (Sec. 4.3): [`ScoreMemory`] keeps the detached score sequences of the last
//!   τ batches; [`Rambo::forward_with_memory`] evaluates them with the current batch (they
//!   change the value, the normalisation and the code's `NumSequences` count, and receive no
//!   gradient), and returns the current batch's sequences for the caller to
//!   [`ScoreMemory::push`] — an explicit update, so the state is never changed behind a
//!   forward pass.
//!
//! λ is in the units of the ranks ([`RankUnits`]); the defaults use the authors' normalised
//! ranks. The retrieval hyperparameters of the paper are in its supplement, which we do not
//! have; the defaults λ = 4, α = 0.02 are those used for the "Blackbox AP" baselines of
//! Smooth-AP (supp. B.2.3), ROADMAP and SupRank (`blackboxap.yaml`).
//!
//! The computation runs in query chunks (`O(chunk × B)` working set): the backward pass
//! recomputes each chunk's sequences and applies Algorithm 1 row by row, which is exactly what
//! the authors' whole-matrix `TrueRanker` does because ranking is row-wise.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::blackbox_rank::{
    check_lambda, descending_ranks, ranks_of, sparse_blackbox_gradient, RankUnits,
};
use crate::losses::config::{finite, positive, LossContext, LossRecipe};
use crate::losses::pairwise_rows::{chunk_size, fine_ids, row_loss, Input, RowLoss};
use crate::losses::{check_batch, RankLoss};
use candle_core::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub mod device;

/// The rank metric that RaMBO optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamboObjective {
    /// `L_AP = 1 − AP` (Eq. 21–22; ROADMAP/SupRank `BlackBoxAP`).
    Ap,
    /// `L_rec` (Eq. 20) with the given rank weighting.
    Recall(RecallWeight),
}

/// The weighting of the recall loss (RaMBO Eq. 19–20).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecallWeight {
    /// `ℓ(k) = log(1 + k)`, i.e. `w_K ≈ 1/K` ("RaMBO log").
    Log,
    /// `ℓ(k) = log(1 + log(1 + k))`, i.e. `w_K ≈ 1/(K log K)` ("RaMBO log log").
    LogLog,
}

impl RecallWeight {
    /// `ℓ(r)`, the per-positive loss (Eq. 20).
    pub fn value(self, r: f64) -> f64 {
        match self {
            RecallWeight::Log => r.ln_1p(),
            RecallWeight::LogLog => r.ln_1p().ln_1p(),
        }
    }

    /// `dℓ/dr`.
    pub fn derivative(self, r: f64) -> f64 {
        match self {
            RecallWeight::Log => 1.0 / (1.0 + r),
            RecallWeight::LogLog => 1.0 / ((1.0 + r.ln_1p()) * (1.0 + r)),
        }
    }

    /// The weight `w_K = ℓ(K) − ℓ(K − 1)` of Eq. 19 for which the closed form of Eq. 20 is exact:
    /// `Σ_{K ≥ 1} w_K · 1[r ≥ K] = ℓ(r)` for every integer `r ≥ 0`.
    pub fn weight(self, k: usize) -> f64 {
        self.value(k as f64) - self.value(k as f64 - 1.0)
    }
}

/// How the margin α shifts the scores before ranking (Eq. 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MarginMode {
    /// `y − α(y* − ½)` (the paper; `RecallLoss`).
    #[default]
    Deterministic,
    /// `y − α·|ξ|·(y* − ½)` with `ξ ~ N(0, 1)` drawn afresh for every entry at every forward
    /// pass (`MapLoss`, ROADMAP/SupRank `BlackBoxAP`). Reproducible: the draws come from a
    /// ChaCha8 stream keyed by `seed`, the forward-pass count and the sequence index.
    HalfNormal {
        /// Seed of the draws.
        seed: u64,
    },
}

/// How the per-positive terms are averaged into the batch loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Averaging {
    /// Per-query loss, averaged over the sequences with a relevant item (the paper, Sec. 5.1).
    #[default]
    PerQuery,
    /// Σ over every positive of every sequence divided by the number of positives
    /// (`blackbox-backprop/recall.py`).
    PooledPositives,
}

/// How the recall loss counts the negatives ahead of a positive (`r_i`, Eq. 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecallCount {
    /// `r_i = rk_i − rk⁺_i` in integer ranks (the paper).
    #[default]
    Exact,
    /// The code's `(rk − rk⁺)_normalised · num_sequences`: `r_i · S / n` with `S` the number of
    /// sequences evaluated (batch plus memory) and `n` their length.
    NumSequences,
}

/// A RaMBO loss (see the module documentation). Its only interior state is the forward-pass
/// counter of the stochastic margin.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::losses::{rambo::Rambo, RankLoss};
/// use rankwise::Labels;
/// // Four unit vectors, two classes: cosines s01 = 0.8, s23 = 0.8, s13 = 0.96, s03 = s12 = 0.6.
/// let x = Tensor::new(&[[1.0f64, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]], &Device::Cpu)?;
/// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
/// // The forward pass ranks exactly: without margin the AP loss is 1 − mAP (Eq. 22).
/// let ap = Rambo { margin: 0.0, ..Rambo::ap() };
/// assert!((ap.forward(&x, &labels)?.to_scalar::<f64>()? - 0.25).abs() < 1e-12);
/// // Eq. 14 lowers the positives' scores by α/2 and raises the negatives' by α/2: with α = 0.3
/// // every negative within 0.3 of a positive counts as ranked above it. Queries 0 and 2 then
/// // have AP 1/2, queries 1 and 3 AP 1/3: 1 − mAP = 1 − 5/12.
/// let with_margin = Rambo { margin: 0.3, ..Rambo::ap() }.forward(&x, &labels)?.to_scalar::<f64>()?;
/// assert!((with_margin - 7.0 / 12.0).abs() < 1e-12);
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Rambo {
    /// AP or recall.
    pub objective: RamboObjective,
    /// Interpolation strength λ > 0 (Eq. 10), in the units of `units`.
    pub lambda: f64,
    /// Margin α ≥ 0 (Eq. 14), in cosine-similarity units.
    pub margin: f64,
    /// Deterministic (paper) or half-normal (authors' AP code) margin.
    pub margin_mode: MarginMode,
    /// Units of the ranks that the blackbox differentiates (λ's units).
    pub units: RankUnits,
    /// Keep the query in its own sequence (as a relevant item with similarity 1), as
    /// ROADMAP/SupRank's in-batch `BlackBoxAP` does; the paper removes it.
    pub include_self: bool,
    /// Per-query mean (paper) or pooled over positives (recall code).
    pub averaging: Averaging,
    /// How `r_i` is counted (recall only).
    pub recall_count: RecallCount,
    /// Added to the number of relevant items in the per-query AP denominator (ROADMAP's
    /// `BlackBoxAP` adds 1e-5; the paper 0).
    pub ap_epsilon: f64,
    /// Queries per chunk (`None`: the whole batch at once). Working set `O(chunk × B)`.
    pub query_chunk: Option<usize>,
    /// Counts the forward passes, which key the half-normal margin draws (start it from
    /// `PassCounter::default()`).
    pub passes: PassCounter,
}

/// The number of forward passes a [`Rambo`] loss has made; each pass of the half-normal margin
/// ([`MarginMode::HalfNormal`]) draws from its own stream. Cloning copies the count.
#[derive(Debug, Default)]
pub struct PassCounter(AtomicU64);

impl PassCounter {
    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the count (restoring a checkpoint).
    pub fn set(&self, count: u64) {
        self.0.store(count, Ordering::Relaxed)
    }

    /// Returns the current count and increments it.
    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

impl Clone for PassCounter {
    fn clone(&self) -> Self {
        PassCounter(AtomicU64::new(self.get()))
    }
}

impl Default for Rambo {
    /// "RaMBO log log", the variant with the best SOP and CUB numbers (Tables 2, 3, 7), with
    /// the paper's per-query averaging, exact counts and deterministic margin, the query
    /// excluded, λ = 4 and α = 0.02 on normalised ranks (see the module documentation).
    fn default() -> Self {
        Rambo {
            objective: RamboObjective::Recall(RecallWeight::LogLog),
            lambda: 4.0,
            margin: 0.02,
            margin_mode: MarginMode::Deterministic,
            units: RankUnits::Normalised,
            include_self: false,
            averaging: Averaging::PerQuery,
            recall_count: RecallCount::Exact,
            ap_epsilon: 0.0,
            query_chunk: None,
            passes: PassCounter::default(),
        }
    }
}

impl Rambo {
    /// The recall loss with the given weighting, other settings as in [`Rambo::default`].
    pub fn recall(weight: RecallWeight) -> Self {
        Rambo {
            objective: RamboObjective::Recall(weight),
            ..Rambo::default()
        }
    }

    /// The AP loss of Eq. 22, other settings as in [`Rambo::default`].
    pub fn ap() -> Self {
        Rambo {
            objective: RamboObjective::Ap,
            ..Rambo::default()
        }
    }

    /// ROADMAP/SupRank's `BlackBoxAP(lambda_val=4, margin=0.02)` as called on an in-batch
    /// similarity matrix: AP loss, half-normal margin, query kept in its sequence, `+1e-5` in
    /// the denominator, normalised ranks, mean over queries.
    pub fn roadmap_blackbox_ap(seed: u64) -> Self {
        Rambo {
            objective: RamboObjective::Ap,
            margin_mode: MarginMode::HalfNormal { seed },
            include_self: true,
            ap_epsilon: 1e-5,
            ..Rambo::default()
        }
    }

    /// `blackbox-backprop`'s `RecallLoss(lambda_val, margin, weight_fn)` conventions: pooled
    /// average over positives and counts de-normalised by the number of sequences.
    pub fn authors_recall(weight: RecallWeight, lambda: f64, margin: f64) -> Self {
        Rambo {
            objective: RamboObjective::Recall(weight),
            lambda,
            margin,
            averaging: Averaging::PooledPositives,
            recall_count: RecallCount::NumSequences,
            ..Rambo::default()
        }
    }

    fn validate(&self) -> Result<()> {
        check_lambda(self.lambda)?;
        if !self.margin.is_finite() || self.margin < 0.0 {
            return Err(Error::invalid(
                "margin",
                format!("must be finite and ≥ 0, got {}", self.margin),
            ));
        }
        if !self.ap_epsilon.is_finite() || self.ap_epsilon < 0.0 {
            return Err(Error::invalid(
                "ap_epsilon",
                format!("must be finite and ≥ 0, got {}", self.ap_epsilon),
            ));
        }
        Ok(())
    }

    /// The loss of one sequence on its own (deterministic margin): `1 − AP` or the mean of
    /// `ℓ(r_i)` over its relevant items, with `r_i` counted exactly. `None` without relevant
    /// items. For hand-worked checks of Eq. 14–22.
    pub fn sequence_loss(&self, scores: &[f64], relevant: &[bool]) -> Result<Option<f64>> {
        self.validate()?;
        if scores.len() != relevant.len() {
            return Err(Error::Shape(format!(
                "{} scores but {} relevance flags",
                scores.len(),
                relevant.len()
            )));
        }
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return Err(Error::invalid("scores", format!("entry {i} is not finite")));
        }
        let shifted = margin_shift(scores, relevant, self.margin, None);
        let ranked = RankedSequence::new(&shifted, relevant);
        if ranked.num_pos == 0 {
            return Ok(None);
        }
        let term = self.term(&ranked, 1.0);
        Ok(Some(match self.objective {
            RamboObjective::Ap => 1.0 - term / (ranked.num_pos as f64 + self.ap_epsilon),
            RamboObjective::Recall(_) => term / ranked.num_pos as f64,
        }))
    }

    /// The loss of the batch together with the τ stored batches of `memory`, and the current
    /// batch's detached sequences to store with [`ScoreMemory::push`] (RaMBO Sec. 4.3).
    pub fn forward_with_memory(
        &self,
        embeddings: &Tensor,
        labels: &Labels,
        memory: &ScoreMemory,
    ) -> Result<(Tensor, ScoreRows)> {
        // On a GPU: the batch's ranks, terms and blackbox gradient by kernels; the memory's
        // sequences are on the host already.
        if device::applies(self, embeddings) {
            return device::forward(self, embeddings, labels, memory, true);
        }
        let (loss, rows) = self.run(embeddings, labels, memory, true)?;
        let mut scores = Vec::with_capacity(rows.len());
        let mut relevant = Vec::with_capacity(rows.len());
        for row in rows.iter() {
            if let Some((s, r)) = &row.sequence {
                scores.push(s.clone());
                relevant.push(r.clone());
            }
        }
        Ok((loss, ScoreRows { scores, relevant }))
    }

    fn run(
        &self,
        embeddings: &Tensor,
        labels: &Labels,
        memory: &ScoreMemory,
        keep_sequences: bool,
    ) -> Result<(Tensor, Arc<Vec<RamboRow>>)> {
        check_batch(embeddings, labels)?;
        self.validate()?;
        let chunk = chunk_size(self.query_chunk, labels.len())?;
        let rows = self.rows(labels, memory, keep_sequences)?;
        row_loss(embeddings, Input::Normalise, rows, chunk)
    }

    /// What every engine shares for one forward pass: the pass (counted here, it keys the
    /// half-normal draws), the classes and the stored sequences' terms (evaluated here: they
    /// receive no gradient).
    fn rows(
        &self,
        labels: &Labels,
        memory: &ScoreMemory,
        keep_sequences: bool,
    ) -> Result<RamboRows> {
        self.validate()?;
        let b = labels.len();
        let pass = self.passes.next();
        let draw_seed = match self.margin_mode {
            MarginMode::Deterministic => None,
            MarginMode::HalfNormal { seed } => Some(mix(seed, pass)),
        };
        let mut rows = RamboRows {
            cfg: self.clone(),
            fine: fine_ids(labels),
            draw_seed,
            num_sequences: b + memory.num_sequences(),
            memory_terms: Vec::new(),
            keep_sequences,
        };
        // τ·B sequences ranked at every step: in parallel (each has its own draws' stream).
        let stored: Vec<(&[f64], &[bool])> = memory.sequences().collect();
        rows.memory_terms = stored
            .par_iter()
            .enumerate()
            .map(|(i, (s, r))| rows.evaluate(b + i, s, r).map(|e| (e.term, e.num_pos)))
            .collect();
        Ok(rows)
    }

    /// Σ over the relevant items of the per-item value (`Prec(i)` or `ℓ(r_i)`);
    /// `count_scale` multiplies the integer `rk − rk⁺` for [`RecallCount::NumSequences`].
    fn term(&self, ranked: &RankedSequence, count_scale: f64) -> f64 {
        let mut sum = 0.0;
        for (i, &rel) in ranked.relevant.iter().enumerate() {
            if !rel {
                continue;
            }
            let (rk, rk_pos) = (ranked.ranks[i], ranked.ranks_pos[i]);
            sum += match self.objective {
                RamboObjective::Ap => rk_pos as f64 / rk as f64,
                RamboObjective::Recall(w) => w.value((rk - rk_pos) as f64 * count_scale),
            };
        }
        sum
    }
}

impl RankLoss for Rambo {
    /// The RaMBO loss of the batch without score memory. Normalises the embeddings itself.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        // On a GPU: ranks, terms and the blackbox gradient by kernels, on the device.
        if device::applies(self, embeddings) {
            return Ok(device::forward(self, embeddings, labels, &ScoreMemory::new(0), false)?.0);
        }
        Ok(self.run(embeddings, labels, &ScoreMemory::new(0), false)?.0)
    }

    /// The forward-pass count, which keys the half-normal margin draws.
    fn state_json(&self) -> Result<Option<String>> {
        Ok(Some(self.passes.get().to_string()))
    }

    fn load_state_json(&self, json: &str) -> Result<()> {
        let count: u64 = json.trim().parse().map_err(|_| {
            Error::invalid(
                "loss state",
                format!("expected a RaMBO pass count, got `{json}`"),
            )
        })?;
        self.passes.set(count);
        Ok(())
    }
}

/// The score shift of Eq. 14: relevant scores minus `α/2`, irrelevant plus `α/2`, each scaled by
/// `magnitudes[i]` when given (the half-normal `|ξ|` of the authors' AP code).
pub fn margin_shift(
    scores: &[f64],
    relevant: &[bool],
    margin: f64,
    magnitudes: Option<&[f64]>,
) -> Vec<f64> {
    scores
        .iter()
        .zip(relevant)
        .enumerate()
        .map(|(i, (&s, &rel))| {
            let sign = if rel { 0.5 } else { -0.5 };
            let m = magnitudes.map_or(1.0, |m| m[i]);
            s - margin * (m * sign)
        })
        .collect()
}

/// Rank of each relevant item among the relevant items (1-based, in the order of `ranks`; 0 for
/// irrelevant items): the code's `rank(−rk + 2·y*)`.
pub fn ranks_among_relevant(ranks: &[usize], relevant: &[bool]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ranks.len()).filter(|&i| relevant[i]).collect();
    order.sort_by_key(|&i| ranks[i]);
    let mut out = vec![0; ranks.len()];
    for (k, &i) in order.iter().enumerate() {
        out[i] = k + 1;
    }
    out
}

/// The most relevant items of a sequence whose ranks are counted ([`ranks_of`], `O(n · P)`)
/// rather than read off a sort of the whole sequence (`O(n log n)`). The value pass reads the
/// relevant items' ranks only; at B = 256 with 4 images per class (P = 3) sorting every
/// sequence was most of the step.
const MOST_COUNTED: usize = 64;

/// A sequence's integer ranks (after the margin shift) and ranks among the relevant items.
struct RankedSequence {
    /// The rank of every entry, or of the relevant entries only (0 for the others) when they
    /// were counted.
    ranks: Vec<usize>,
    ranks_pos: Vec<usize>,
    relevant: Vec<bool>,
    num_pos: usize,
}

impl RankedSequence {
    fn new(shifted: &[f64], relevant: &[bool]) -> Self {
        let positives: Vec<usize> = (0..relevant.len()).filter(|&i| relevant[i]).collect();
        let ranks = if positives.len() <= MOST_COUNTED {
            let mut ranks = vec![0; shifted.len()];
            for (&i, r) in positives.iter().zip(ranks_of(shifted, &positives)) {
                ranks[i] = r;
            }
            ranks
        } else {
            descending_ranks(shifted)
        };
        let ranks_pos = ranks_among_relevant(&ranks, relevant);
        RankedSequence {
            num_pos: positives.len(),
            ranks,
            ranks_pos,
            relevant: relevant.to_vec(),
        }
    }
}

/// One sequence after evaluation: its Σ of per-item values and number of relevant items.
struct Evaluated {
    shifted: Vec<f64>,
    ranked: RankedSequence,
    term: f64,
    num_pos: usize,
}

/// What the value pass keeps of one query row.
struct RamboRow {
    term: f64,
    num_pos: usize,
    /// The raw (unshifted) sequence and its relevance, kept for the score memory.
    sequence: Option<(Vec<f64>, Vec<bool>)>,
}

struct RamboRows {
    cfg: Rambo,
    fine: Arc<Vec<ClassId>>,
    draw_seed: Option<u64>,
    num_sequences: usize,
    memory_terms: Vec<Option<(f64, usize)>>,
    keep_sequences: bool,
}

/// Batch-level normalisation of the loss.
struct RamboGlobal {
    /// Sequences with at least one relevant item.
    queries: usize,
    /// Relevant items over all sequences.
    positives: usize,
    value: f64,
}

impl RamboGlobal {
    /// The counts of the batch's sequences with a relevant item (`batch_pos`: their relevant
    /// items, each > 0) and of the stored ones (`(term, relevant items)`, `None` for a sequence
    /// without any); the value is left at 0. The error of a batch where no sequence has a
    /// relevant item. Shared by the row engine and the device path, which counts from the labels.
    fn counting(
        batch_pos: impl Iterator<Item = usize>,
        memory_terms: &[Option<(f64, usize)>],
    ) -> Result<RamboGlobal> {
        let (mut queries, mut positives) = (0, 0);
        for p in batch_pos.chain(memory_terms.iter().flatten().map(|t| t.1)) {
            queries += 1;
            positives += p;
        }
        if queries == 0 {
            return Err(no_relevant_item());
        }
        Ok(RamboGlobal {
            queries,
            positives,
            value: 0.0,
        })
    }
}

impl RamboRows {
    /// Query `q`'s sequence: scores, relevance and the batch column of each entry.
    fn sequence(&self, q: usize, sims: &[f64]) -> (Vec<f64>, Vec<bool>, Vec<usize>) {
        let keep = |j: usize| j != q || self.cfg.include_self;
        let cols: Vec<usize> = (0..sims.len()).filter(|&j| keep(j)).collect();
        let scores = cols.iter().map(|&j| sims[j]).collect();
        let relevant = cols.iter().map(|&j| self.fine[j] == self.fine[q]).collect();
        (scores, relevant, cols)
    }

    /// The half-normal magnitudes of sequence `index` (current rows first, then memory rows),
    /// identical in the value and the gradient pass and for every chunking.
    fn magnitudes(&self, index: usize, n: usize) -> Option<Vec<f64>> {
        self.draw_seed.map(|seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(index as u64);
            (0..n)
                .map(|_| rng.sample::<f64, _>(StandardNormal).abs())
                .collect()
        })
    }

    /// `count_scale` of [`Rambo::term`] for a sequence of length `n`.
    fn count_scale(&self, n: usize) -> f64 {
        match self.cfg.recall_count {
            RecallCount::Exact => 1.0,
            RecallCount::NumSequences => self.num_sequences as f64 / n as f64,
        }
    }

    fn evaluate(&self, index: usize, scores: &[f64], relevant: &[bool]) -> Option<Evaluated> {
        let mags = self.magnitudes(index, scores.len());
        let shifted = margin_shift(scores, relevant, self.cfg.margin, mags.as_deref());
        let ranked = RankedSequence::new(&shifted, relevant);
        if ranked.num_pos == 0 {
            return None;
        }
        let term = self.cfg.term(&ranked, self.count_scale(scores.len()));
        Some(Evaluated {
            shifted,
            num_pos: ranked.num_pos,
            ranked,
            term,
        })
    }

    fn normaliser(&self, num_pos: usize, global: &RamboGlobal) -> f64 {
        normaliser(&self.cfg, num_pos, global)
    }
}

/// The weight of a sequence's Σ term in the loss: `1/(Q·(P + ε))` per query or `1/P_total`.
fn normaliser(cfg: &Rambo, num_pos: usize, global: &RamboGlobal) -> f64 {
    match cfg.averaging {
        Averaging::PerQuery => {
            let eps = match cfg.objective {
                RamboObjective::Ap => cfg.ap_epsilon,
                RamboObjective::Recall(_) => 0.0,
            };
            1.0 / (global.queries as f64 * (num_pos as f64 + eps))
        }
        Averaging::PooledPositives => 1.0 / global.positives as f64,
    }
}

/// The error of a batch where no query has a relevant item.
fn no_relevant_item() -> Error {
    Error::invalid(
        "labels",
        "RaMBO is undefined for this batch: no query has a relevant item (an item of \
         its class other than itself)",
    )
}

impl RowLoss for RamboRows {
    type Row = RamboRow;
    type Global = RamboGlobal;

    fn summarise(&self, q: usize, sims: &[f64]) -> RamboRow {
        let (scores, relevant, _) = self.sequence(q, sims);
        let eval = self.evaluate(q, &scores, &relevant);
        RamboRow {
            term: eval.as_ref().map_or(0.0, |e| e.term),
            num_pos: eval.as_ref().map_or(0, |e| e.num_pos),
            sequence: self.keep_sequences.then_some((scores, relevant)),
        }
    }

    fn global(&self, rows: &[RamboRow]) -> Result<RamboGlobal> {
        let batch = rows
            .iter()
            .filter(|r| r.num_pos > 0)
            .map(|r| (r.term, r.num_pos));
        let mut global = RamboGlobal::counting(batch.clone().map(|t| t.1), &self.memory_terms)?;
        let total: f64 = batch
            .chain(self.memory_terms.iter().flatten().copied())
            .map(|(term, p)| term * self.normaliser(p, &global))
            .sum();
        global.value = match self.cfg.objective {
            RamboObjective::Ap => 1.0 - total,
            RamboObjective::Recall(_) => total,
        };
        Ok(global)
    }

    fn value(&self, global: &RamboGlobal) -> f64 {
        global.value
    }

    fn row_grad(
        &self,
        q: usize,
        sims: &[f64],
        row: &RamboRow,
        global: &RamboGlobal,
        upstream: f64,
        out: &mut [f64],
    ) {
        if row.num_pos == 0 {
            return;
        }
        let (scores, relevant, cols) = self.sequence(q, sims);
        let Some(eval) = self.evaluate(q, &scores, &relevant) else {
            return;
        };
        let n = scores.len();
        let units = self.cfg.units;
        let weight = upstream * self.normaliser(eval.num_pos, global);
        let count_scale = self.count_scale(n);
        // ∂loss/∂rk in `units` for every entry (0 for irrelevant items: the loss reads only the
        // relevant items' ranks, and rk⁺ is a constant).
        let ranked = &eval.ranked;
        let grad_rank: Vec<f64> = (0..n)
            .map(|i| {
                if !relevant[i] {
                    return 0.0;
                }
                let (rk, rk_pos) = (ranked.ranks[i], ranked.ranks_pos[i]);
                match self.cfg.objective {
                    // loss ∋ −rk⁺/rk ⇒ ∂/∂rk = rk⁺/rk² (in units).
                    RamboObjective::Ap => {
                        let (r, rp) = (units.value(rk, n), units.value(rk_pos, n));
                        weight * rp / (r * r)
                    }
                    // r = (rk_int − rk⁺_int)·count_scale and rk_int = rk_units · (n or 1).
                    RamboObjective::Recall(w) => {
                        let per_unit = match units {
                            RankUnits::Integer => 1.0,
                            RankUnits::Normalised => n as f64,
                        };
                        let r = (rk - rk_pos) as f64 * count_scale;
                        weight * w.derivative(r) * count_scale * per_unit
                    }
                }
            })
            .collect();
        let grad = sparse_blackbox_gradient(&eval.shifted, &grad_rank, self.cfg.lambda, units);
        for (g, &j) in grad.iter().zip(&cols) {
            out[j] += g;
        }
    }
}

/// SplitMix64 of `seed` and `pass`: a fresh, well-mixed seed per forward pass.
fn mix(seed: u64, pass: u64) -> u64 {
    let mut z = seed ^ pass.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The detached score sequences of one batch (raw scores before the margin, and relevance), as
/// RaMBO ranked them.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ScoreRows {
    scores: Vec<Vec<f64>>,
    relevant: Vec<Vec<bool>>,
}

impl ScoreRows {
    /// Sequences from explicit scores and relevance flags (one `Vec` per sequence). Errors on a
    /// length mismatch or a non-finite score.
    pub fn new(scores: Vec<Vec<f64>>, relevant: Vec<Vec<bool>>) -> Result<Self> {
        if scores.len() != relevant.len() {
            return Err(Error::Shape(format!(
                "{} score sequences but {} relevance sequences",
                scores.len(),
                relevant.len()
            )));
        }
        for (i, (s, r)) in scores.iter().zip(&relevant).enumerate() {
            if s.len() != r.len() {
                return Err(Error::Shape(format!(
                    "sequence {i}: {} scores but {} relevance flags",
                    s.len(),
                    r.len()
                )));
            }
            if s.iter().any(|v| !v.is_finite()) {
                return Err(Error::invalid(
                    "scores",
                    format!("sequence {i} has a non-finite score"),
                ));
            }
        }
        Ok(ScoreRows { scores, relevant })
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// The sequences as `(scores, relevance)`.
    pub fn iter(&self) -> impl Iterator<Item = (&[f64], &[bool])> {
        self.scores
            .iter()
            .zip(&self.relevant)
            .map(|(s, r)| (s.as_slice(), r.as_slice()))
    }
}

/// RaMBO's score memory (Sec. 4.3): the detached sequences of the last `capacity` (τ) batches,
/// oldest first. Updated only by [`ScoreMemory::push`].
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ScoreMemory {
    capacity: usize,
    batches: VecDeque<ScoreRows>,
}

impl ScoreMemory {
    /// An empty memory of `capacity` batches (τ; 0 disables the memory).
    pub fn new(capacity: usize) -> Self {
        ScoreMemory {
            capacity,
            batches: VecDeque::with_capacity(capacity),
        }
    }

    /// τ, the number of batches kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of batches stored.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether no batch is stored.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Number of sequences over the stored batches.
    pub fn num_sequences(&self) -> usize {
        self.batches.iter().map(ScoreRows::len).sum()
    }

    /// Stores a batch, dropping the oldest when `capacity` batches are already stored
    /// (`capacity = 0` stores nothing).
    pub fn push(&mut self, rows: ScoreRows) {
        if self.capacity == 0 {
            return;
        }
        while self.batches.len() >= self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back(rows);
    }

    /// Forgets every stored batch (e.g. at the start of an epoch).
    pub fn clear(&mut self) {
        self.batches.clear();
    }

    /// Every stored sequence, oldest batch first.
    pub fn sequences(&self) -> impl Iterator<Item = (&[f64], &[bool])> {
        self.batches.iter().flat_map(ScoreRows::iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ap_of_the_smooth_ap_worked_example() {
        // Smooth-AP supp. B.1.6: positives at ranks 1, 3, 4, 8 → AP = 0.729167.
        let scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2];
        let relevant = [true, false, true, true, false, false, false, true];
        let loss = Rambo {
            margin: 0.0,
            ..Rambo::ap()
        };
        let l = loss.sequence_loss(&scores, &relevant).unwrap().unwrap();
        let ap = (1.0 + 2.0 / 3.0 + 3.0 / 4.0 + 4.0 / 8.0) / 4.0;
        assert!((l - (1.0 - ap)).abs() < 1e-15);
        // Negatives ahead of the positives: 0, 1, 1, 4.
        let rec = Rambo {
            margin: 0.0,
            ..Rambo::recall(RecallWeight::Log)
        };
        let l = rec.sequence_loss(&scores, &relevant).unwrap().unwrap();
        let want = (0f64.ln_1p() + 1f64.ln_1p() + 1f64.ln_1p() + 4f64.ln_1p()) / 4.0;
        assert!((l - want).abs() < 1e-15);
    }

    #[test]
    fn margin_moves_positives_down_and_negatives_up() {
        let shifted = margin_shift(&[0.5, 0.5], &[true, false], 0.2, None);
        assert_eq!(shifted, vec![0.4, 0.6]);
        let shifted = margin_shift(&[0.5, 0.5], &[true, false], 0.2, Some(&[2.0, 0.5]));
        assert!((shifted[0] - 0.3).abs() < 1e-15 && (shifted[1] - 0.55).abs() < 1e-15);
        // A 0.1 lead of a positive is not enough under α = 0.2: the negative ranks first.
        let loss = Rambo {
            margin: 0.2,
            ..Rambo::ap()
        };
        let l = loss
            .sequence_loss(&[0.6, 0.5], &[true, false])
            .unwrap()
            .unwrap();
        assert!((l - 0.5).abs() < 1e-15);
    }

    #[test]
    fn recall_closed_form_equals_the_weighted_sum_of_eq_19() {
        // L_rec = Σ_K w_K · L@K with L@K = 1 − r̃@K = fraction of positives with r_i ≥ K (Eq. 16,
        // 18), summed by brute force, against the closed form of Eq. 20.
        let scores = [0.95, 0.1, 0.8, 0.85, 0.3, 0.7, 0.2, 0.6, 0.5, 0.4, 0.9];
        let relevant = [
            false, true, true, false, true, false, false, true, false, false, true,
        ];
        for w in [RecallWeight::Log, RecallWeight::LogLog] {
            let loss = Rambo {
                margin: 0.0,
                ..Rambo::recall(w)
            };
            let closed = loss.sequence_loss(&scores, &relevant).unwrap().unwrap();
            let ranks = descending_ranks(&scores);
            let ranks_pos = ranks_among_relevant(&ranks, &relevant);
            let r: Vec<usize> = (0..scores.len())
                .filter(|&i| relevant[i])
                .map(|i| ranks[i] - ranks_pos[i])
                .collect();
            let mut brute = 0.0;
            for k in 1..=scores.len() {
                let l_at_k = r.iter().filter(|&&ri| ri >= k).count() as f64 / r.len() as f64;
                brute += w.weight(k) * l_at_k;
            }
            assert!((closed - brute).abs() < 1e-14, "{w:?}: {closed} vs {brute}");
        }
    }

    #[test]
    fn memory_keeps_the_last_tau_batches() {
        let batch = |v: f64| ScoreRows::new(vec![vec![v, 0.0]], vec![vec![true, false]]).unwrap();
        let mut m = ScoreMemory::new(2);
        m.push(batch(1.0));
        m.push(batch(2.0));
        m.push(batch(3.0));
        assert_eq!(m.len(), 2);
        let firsts: Vec<f64> = m.sequences().map(|(s, _)| s[0]).collect();
        assert_eq!(firsts, vec![2.0, 3.0]);
        let mut off = ScoreMemory::new(0);
        off.push(batch(1.0));
        assert!(off.is_empty());
        assert!(ScoreRows::new(vec![vec![0.0]], vec![vec![true, false]]).is_err());
    }
}

/// RaMBO with its score memory as a [`RankLoss`] for a training loop (Sec. 4.3): each forward
/// pass ranks the batch together with the detached scores of the last τ batches, then stores
/// the batch's own scores. The memory is state: call `forward` once per optimisation step (the
/// trainer does, also with chunked large batches), and checkpoint it with
/// [`RankLoss::state_json`].
#[derive(Debug)]
pub struct RamboWithMemory {
    /// The loss.
    pub rambo: Rambo,
    memory: std::sync::Mutex<ScoreMemory>,
}

impl RamboWithMemory {
    /// `rambo` with an empty memory of `capacity` (τ) batches.
    pub fn new(rambo: Rambo, capacity: usize) -> Self {
        RamboWithMemory {
            rambo,
            memory: std::sync::Mutex::new(ScoreMemory::new(capacity)),
        }
    }

    /// A copy of the memory's current content.
    pub fn memory(&self) -> ScoreMemory {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScoreMemory> {
        // A panic while the lock was held cannot leave the memory half-updated (`push` is the
        // only mutation), so a poisoned lock is still consistent.
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct MemoryState {
    passes: u64,
    memory: ScoreMemory,
}

impl RankLoss for RamboWithMemory {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        let mut memory = self.lock();
        let (loss, rows) = self
            .rambo
            .forward_with_memory(embeddings, labels, &memory)?;
        memory.push(rows);
        Ok(loss)
    }

    fn state_json(&self) -> Result<Option<String>> {
        let state = MemoryState {
            passes: self.rambo.passes.get(),
            memory: self.memory(),
        };
        serde_json::to_string(&state)
            .map(Some)
            .map_err(|e| Error::invalid("loss state", e.to_string()))
    }

    fn load_state_json(&self, json: &str) -> Result<()> {
        let state: MemoryState = serde_json::from_str(json)
            .map_err(|e| Error::invalid("loss state", format!("not a RaMBO memory: {e}")))?;
        if state.memory.capacity() != self.lock().capacity() {
            return Err(Error::invalid(
                "loss state",
                format!(
                    "the checkpoint's score memory holds {} batches, this loss {}",
                    state.memory.capacity(),
                    self.lock().capacity()
                ),
            ));
        }
        self.rambo.passes.set(state.passes);
        *self.lock() = state.memory;
        Ok(())
    }
}

/// The metric RaMBO optimises, as a recipe names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RamboMetric {
    /// `1 − AP` (Eq. 21–22).
    Ap,
    /// The recall loss with `ℓ(k) = log(1 + k)` ("RaMBO log").
    RecallLog,
    /// The recall loss with `ℓ(k) = log(1 + log(1 + k))` ("RaMBO log log").
    RecallLogLog,
}

impl RamboMetric {
    /// The loss's objective for this metric.
    pub fn objective(self) -> RamboObjective {
        match self {
            RamboMetric::Ap => RamboObjective::Ap,
            RamboMetric::RecallLog => RamboObjective::Recall(RecallWeight::Log),
            RamboMetric::RecallLogLog => RamboObjective::Recall(RecallWeight::LogLog),
        }
    }

    fn of(objective: RamboObjective) -> Self {
        match objective {
            RamboObjective::Ap => RamboMetric::Ap,
            RamboObjective::Recall(RecallWeight::Log) => RamboMetric::RecallLog,
            RamboObjective::Recall(RecallWeight::LogLog) => RamboMetric::RecallLogLog,
        }
    }
}

/// RaMBO's recipe (`[loss] kind = "rambo"`): the hyperparameters of [`Rambo`] that the papers'
/// tables vary, and the score memory that makes it a [`RamboWithMemory`]. A recipe of its own
/// because the half-normal margin takes its seed from the run and the memory is state; its
/// `Default` reads [`Rambo::default`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RamboConfig {
    /// The optimised metric (default: recall log log, the paper's best on SOP/CUB).
    pub metric: RamboMetric,
    /// Interpolation strength λ of the blackbox gradient (Eq. 10; paper: 4).
    pub lambda: f64,
    /// Margin α on normalised ranks (Eq. 14; 0 disables it; paper: 0.02).
    pub margin: f64,
    /// The authors' `MapLoss` margin `α·|ξ|`, `ξ ~ N(0, 1)` (seeded by the run), instead of the
    /// paper's deterministic one.
    pub half_normal_margin: bool,
    /// Score memory: the number τ of past batches whose detached scores join the ranking
    /// (Sec. 4.3; 0 = no memory).
    pub memory: usize,
}

impl Default for RamboConfig {
    fn default() -> Self {
        let d = Rambo::default();
        RamboConfig {
            metric: RamboMetric::of(d.objective),
            lambda: d.lambda,
            margin: d.margin,
            half_normal_margin: d.margin_mode != MarginMode::Deterministic,
            memory: 0,
        }
    }
}

impl LossRecipe for RamboConfig {
    fn name(&self) -> String {
        "rambo".into()
    }

    fn validate(&self) -> Result<()> {
        positive("lambda", self.lambda)?;
        finite("margin", self.margin)
    }

    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        let rambo = Rambo {
            objective: self.metric.objective(),
            lambda: self.lambda,
            margin: self.margin,
            margin_mode: if self.half_normal_margin {
                MarginMode::HalfNormal { seed: ctx.seed }
            } else {
                MarginMode::Deterministic
            },
            ..Rambo::default()
        };
        Ok(if self.memory > 0 {
            Box::new(RamboWithMemory::new(rambo, self.memory))
        } else {
            Box::new(rambo)
        })
    }
}

#[cfg(test)]
mod memory_loss_tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn memory_loss_matches_explicit_memory_and_restores_its_state() {
        let labels = Labels::new((0..8).map(|i| vec![i / 2]).collect()).unwrap();
        let a = Tensor::randn(0f64, 1.0, (8, 4), &Device::Cpu).unwrap();
        let b = Tensor::randn(0f64, 1.0, (8, 4), &Device::Cpu).unwrap();
        let with_memory = RamboWithMemory::new(Rambo::default(), 1);
        let la = with_memory.forward(&a, &labels).unwrap();
        let lb = with_memory.forward(&b, &labels).unwrap();
        // The same with the memory handled explicitly.
        let rambo = Rambo::default();
        let mut memory = ScoreMemory::new(1);
        let (ea, rows) = rambo.forward_with_memory(&a, &labels, &memory).unwrap();
        memory.push(rows);
        let (eb, _) = rambo.forward_with_memory(&b, &labels, &memory).unwrap();
        let v = |t: &Tensor| t.to_scalar::<f64>().unwrap();
        assert_eq!(v(&la), v(&ea));
        assert_eq!(v(&lb), v(&eb));
        assert_ne!(v(&lb), v(&rambo.forward(&b, &labels).unwrap()));
        // Saving and restoring the state gives the same next value.
        let state = with_memory.state_json().unwrap().unwrap();
        let restored = RamboWithMemory::new(Rambo::default(), 1);
        restored.load_state_json(&state).unwrap();
        assert_eq!(restored.memory(), with_memory.memory());
        let next = v(&with_memory.forward(&a, &labels).unwrap());
        assert_eq!(v(&restored.forward(&a, &labels).unwrap()), next);
        assert!(RamboWithMemory::new(Rambo::default(), 2)
            .load_state_json(&state)
            .is_err());
    }
}

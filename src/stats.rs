//! The statistics behind the verdicts on the papers' claims: a value measured over several
//! seeds ([`Sample`]: mean, standard deviation, 95% interval of the mean) and the test that
//! decides whether two rows differ beyond the run-to-run noise ([`compare`]: a paired t-test
//! over the seeds when both rows ran the same seeds ([`Sample::with_seeds`]), a paired t-test
//! when both rows were measured on the same test units — SSR's episodes and queries
//! ([`Units`]) — else Welch's unequal-variance t-test over the seeds; two-sided, at the 5%
//! level, or at the lower level of a group-sequential design ([`sequential_level`]) when the
//! rows got more seeds after verdicts on them had been read ([`Sample::with_looks`]).
//!
//! The Student-t distribution is computed from the regularised incomplete beta function
//! (continued fraction, Lentz's method) and `ln Γ` (Lanczos, g = 7, 9 terms), so no
//! statistics crate is needed; the tests check them against published quantiles.

/// The significance level of every test (two-sided).
pub const ALPHA: f64 = 0.05;

/// Values measured on shared test units rather than one per seed: SSR scores every method on
/// the same test episodes (few-shot) or the same queries (retrieval), so two rows' values can
/// be matched unit by unit, and a paired test removes the episodes' own difficulty from the
/// noise (an unpaired test over 1,000 episodes counts it twice and is conservative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Units {
    /// Names the test units (e.g. `5-way 1-shot test episodes, split seed 0`): two samples with
    /// the same name hold one value per unit, in the same order.
    pub name: String,
    /// The replicate — the seed of the trained model, which is what a claim generalises over —
    /// of each value. Values of one replicate are consecutive.
    pub replicate: Vec<usize>,
}

impl Units {
    /// `units` units of each of `replicates` replicates (replicate-major).
    pub fn new(name: impl Into<String>, replicates: usize, units: usize) -> Self {
        Units {
            name: name.into(),
            replicate: (0..replicates)
                .flat_map(|r| std::iter::repeat_n(r, units))
                .collect(),
        }
    }

    /// How many replicates (distinct trained models) the values come from.
    pub fn replicates(&self) -> usize {
        let mut r = self.replicate.clone();
        r.dedup();
        r.len()
    }

    /// The mean of `values` (one per unit) within each replicate, in replicate order.
    fn replicate_means(&self, values: &[f64]) -> Vec<f64> {
        replicate_means(&self.replicate, values)
    }
}

/// The mean of `values` over each run of equal consecutive entries of `replicate` (the
/// replicate of each value), in order.
pub fn replicate_means(replicate: &[usize], values: &[f64]) -> Vec<f64> {
    let mut out: Vec<(usize, f64, usize)> = Vec::new();
    for (&r, &v) in replicate.iter().zip(values) {
        match out.last_mut() {
            Some((last, sum, n)) if *last == r => {
                *sum += v;
                *n += 1;
            }
            _ => out.push((r, v, 1)),
        }
    }
    out.into_iter().map(|(_, s, n)| s / n as f64).collect()
}

/// One quantity measured over several seeds (or over shared test units, [`Units`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The value of each seed, in seed order (or of each unit, see [`Sample::units`]).
    pub values: Vec<f64>,
    /// The value is known exactly (a quantity computed, not estimated: e.g. a dataset-wide
    /// metric on fixed scores): one value, no noise.
    pub exact: bool,
    /// `Some` when `values` holds one value per shared test unit rather than one per seed.
    pub units: Option<Units>,
    /// The seed of each value (`Some` only with one value per seed, see
    /// [`Sample::with_seeds`]): two rows that ran the same seeds are compared seed by seed.
    pub seeds: Option<Vec<u64>>,
    /// The seed (or replicate) counts at which verdicts on these values were read, in
    /// increasing order ([`Sample::with_looks`]); empty when the count was fixed in advance.
    pub looks: Vec<usize>,
    /// The paper's printed value of the row these values measure, as a fraction, for each
    /// dataset column the values stand beside ([`Sample::with_published`]); empty when the
    /// paper prints none. A claim carries the paper's gap between two rows to our scale with
    /// them (`experiments::claim`).
    pub published: Vec<(String, f64)>,
}

impl Sample {
    /// The values of the seeds.
    pub fn new(values: Vec<f64>) -> Self {
        Sample {
            values,
            exact: false,
            units: None,
            seeds: None,
            looks: Vec::new(),
            published: Vec::new(),
        }
    }

    /// The values of the seeds `seeds` (one each, in the same order). A seed fixes a training
    /// run's random draws — its initial weights and its batches — so two rows run with the same
    /// seed share them (common random numbers) and their values move together from seed to
    /// seed (median correlation 0.38–0.49 over the row pairs of each training paper's standard
    /// table, 8 seeds): [`compare`] then tests each seed's difference, which removes the shared
    /// part of the noise. The test stays valid where two rows share fewer draws (the seeds'
    /// pairs are still independent of one another); it only gains less. Ignored (no pairing)
    /// unless there is exactly one seed per value.
    pub fn with_seeds(mut self, seeds: Vec<u64>) -> Self {
        if seeds.len() == self.values.len() && self.units.is_none() && !self.exact {
            self.seeds = Some(seeds);
        }
        self
    }

    /// The same values, read at the seed (or replicate) counts `looks` (increasing; the
    /// earlier looks and this one): the rows got more seeds after verdicts on them had been
    /// read at the smaller counts, a group-sequential design, so [`compare`] holds each
    /// comparison to the level of [`sequential_level`] over those looks (those below its own
    /// seed count, and that count) instead of [`ALPHA`]: without it, adding seeds until a gap
    /// turns significant would decide more claims by chance than the 5% the rule states.
    /// Ignored unless the values are one per seed ([`Sample::with_seeds`]) or on units of
    /// several replicates: the looks count seeds (replicates), not repeated draws or timings.
    pub fn with_looks(mut self, looks: Vec<usize>) -> Self {
        let seeded =
            self.seeds.is_some() || self.units.as_ref().is_some_and(|u| u.replicates() >= 2);
        if seeded {
            self.looks = looks;
        }
        self
    }

    /// The same values with the paper's printed value of their row: `(dataset column, value
    /// as a fraction)` for each column the values stand beside. Tests ignore it; a claim reads
    /// the paper's gap between two rows from it.
    pub fn with_published(mut self, published: Vec<(String, f64)>) -> Self {
        self.published = published;
        self
    }

    /// The same sample with `by` added to every value (seeds, units, looks and pairing kept):
    /// testing `shifted(−δ)` against `b` tests whether the gap to `b` differs from `δ`.
    pub fn shifted(&self, by: f64) -> Sample {
        Sample {
            values: self.values.iter().map(|v| v + by).collect(),
            ..self.clone()
        }
    }

    /// One value per test unit of `units` (as many values as `units.replicate`).
    pub fn on_units(values: Vec<f64>, units: Units) -> Self {
        debug_assert_eq!(values.len(), units.replicate.len());
        Sample {
            values,
            exact: false,
            units: Some(units),
            seeds: None,
            looks: Vec::new(),
            published: Vec::new(),
        }
    }

    /// A quantity known exactly: tests treat it as a constant (no variance).
    pub fn exact(value: f64) -> Self {
        Sample {
            values: vec![value],
            exact: true,
            units: None,
            seeds: None,
            looks: Vec::new(),
            published: Vec::new(),
        }
    }

    /// The values the noise is estimated from: the seeds; for values on [`Units`], each
    /// replicate's mean when there are several replicates (the model's seed is the noise a
    /// claim must beat), else the units themselves (one trained model: the noise of its test
    /// units, as the papers' intervals over episodes).
    pub fn replicates(&self) -> std::borrow::Cow<'_, [f64]> {
        match &self.units {
            Some(u) if u.replicates() >= 2 => u.replicate_means(&self.values).into(),
            _ => self.values.as_slice().into(),
        }
    }

    /// Number of seeds (of replicates, or of units with a single replicate).
    pub fn n(&self) -> usize {
        self.replicates().len()
    }

    /// The mean (NaN when empty).
    pub fn mean(&self) -> f64 {
        let v = self.replicates();
        v.iter().sum::<f64>() / v.len() as f64
    }

    /// The sample standard deviation (`n − 1` in the denominator); NaN with fewer than 2 seeds.
    pub fn sd(&self) -> f64 {
        sd(&self.replicates())
    }

    /// The half-width of the 95% confidence interval of the mean, `t_{0.975, n−1} · sd / √n`;
    /// NaN with fewer than 2 seeds.
    pub fn ci95(&self) -> f64 {
        let n = self.n();
        if n < 2 {
            return f64::NAN;
        }
        t_quantile(1.0 - ALPHA / 2.0, (n - 1) as f64) * self.sd() / (n as f64).sqrt()
    }

    /// The same values as seeds: what an unpaired test compares.
    fn as_seeds(&self) -> Sample {
        Sample {
            values: self.replicates().into_owned(),
            exact: self.exact,
            units: None,
            seeds: None,
            looks: Vec::new(),
            published: Vec::new(),
        }
    }
}

/// The sample standard deviation of `v` (`n − 1` in the denominator); NaN below 2 values.
fn sd(v: &[f64]) -> f64 {
    let n = v.len();
    if n < 2 {
        return f64::NAN;
    }
    let m = v.iter().sum::<f64>() / n as f64;
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64).sqrt()
}

/// Which test a [`Comparison`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Welch's unequal-variance t-test over the seeds.
    Welch,
    /// The paired t-test over shared test units (one trained model per row).
    PairedUnits,
    /// The paired t-test over replicates of each replicate's mean difference on the shared
    /// test units.
    PairedReplicates,
    /// The paired t-test over the seeds both rows ran, of each seed's difference.
    PairedSeeds,
}

/// The outcome of comparing two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// `mean(a) − mean(b)`.
    pub difference: f64,
    /// The two-sided p-value (1 when the test cannot be made).
    pub p: f64,
    /// The test that gave `p`.
    pub test: Test,
    /// The level `p` is held to: [`ALPHA`], or [`sequential_level`] of the samples' looks.
    pub level: f64,
}

impl Comparison {
    /// `a` is larger than `b` beyond the noise: the difference is positive and significant.
    pub fn a_larger(&self) -> bool {
        self.difference > 0.0 && self.p < self.level
    }

    /// `b` is larger than `a` beyond the noise.
    pub fn b_larger(&self) -> bool {
        self.difference < 0.0 && self.p < self.level
    }
}

/// Welch's t-test of `mean(a) = mean(b)`, two-sided: `t = (x̄_a − x̄_b) / √(s_a²/n_a + s_b²/n_b)`
/// with the Welch–Satterthwaite degrees of freedom. Needs at least 2 seeds on each side (else
/// `p = 1`: one seed says nothing about the noise) unless it is [`Sample::exact`], which counts
/// as a constant (the test becomes the one-sample t-test of the other side). When both sides
/// are constant, a difference is certain (`p = 0`) and equality is `p = 1`.
pub fn welch(a: &Sample, b: &Sample) -> Comparison {
    let (a, b) = (&a.as_seeds(), &b.as_seeds());
    let difference = a.mean() - b.mean();
    let (na, nb) = (a.n() as f64, b.n() as f64);
    let too_few = |s: &Sample| !s.exact && s.n() < 2;
    let test = Test::Welch;
    if too_few(a) || too_few(b) || !difference.is_finite() {
        return Comparison {
            difference,
            p: 1.0,
            test,
            level: ALPHA,
        };
    }
    // A side's variance of the mean, and its share of the Welch–Satterthwaite denominator.
    let part = |s: &Sample, n: f64| -> (f64, f64) {
        if s.exact {
            (0.0, 0.0)
        } else {
            let v = s.sd().powi(2) / n;
            (v, v * v / (n - 1.0))
        }
    };
    let ((va, da), (vb, db)) = (part(a, na), part(b, nb));
    let se2 = va + vb;
    if se2 == 0.0 {
        let p = if difference == 0.0 { 1.0 } else { 0.0 };
        return Comparison {
            difference,
            p,
            test,
            level: ALPHA,
        };
    }
    let t = difference / se2.sqrt();
    let df = se2 * se2 / (da + db);
    Comparison {
        difference,
        p: two_sided_p(t, df),
        test,
        level: ALPHA,
    }
}

/// The test of `mean(a) = mean(b)` the claims make: paired when `a` and `b` hold values of the
/// same test [`Units`] (same name, same replicates) or one value per seed of the same seeds
/// ([`Sample::with_seeds`]: the seed-by-seed differences, `n − 1` degrees of freedom), else
/// [`welch`] over the seeds (over the replicates' means for values on units).
///
/// Paired, the differences `d_u = a_u − b_u` are formed unit by unit. With one replicate the
/// one-sample t-test of the `d_u` (`n_units − 1` degrees of freedom) asks whether this trained
/// model's rows differ on the population of episodes or queries; with `R ≥ 2` replicates each
/// replicate's mean difference is one observation and the test has `R − 1` degrees of freedom,
/// so the verdict generalises over the seeds of the trained models, not only over the units.
///
/// The level is [`ALPHA`], or, when the samples carry looks ([`Sample::with_looks`]),
/// [`sequential_level`] over the looks below the comparison's own seed count (the seeds both
/// rows share, the smaller count for Welch's test, the replicates for values on units) and that
/// count; a paired test over one model's units has no seeds to look at and keeps [`ALPHA`].
pub fn compare(a: &Sample, b: &Sample) -> Comparison {
    let (mut c, seeds) = match pairing(a, b) {
        Some((d, Test::PairedUnits)) => (paired(&d, Test::PairedUnits), None),
        Some((d, test)) => (paired(&d, test), Some(d.len())),
        None => {
            let seeds = match (a.exact, b.exact) {
                (true, _) => b.n(),
                (_, true) => a.n(),
                _ => a.n().min(b.n()),
            };
            (welch(a, b), Some(seeds))
        }
    };
    if let Some(n) = seeds {
        let mut looks: Vec<usize> = a
            .looks
            .iter()
            .chain(&b.looks)
            .copied()
            .filter(|&l| l < n)
            .collect();
        if !looks.is_empty() {
            looks.push(n);
            c.level = sequential_level(&looks, ALPHA);
        }
    }
    c
}

/// The nominal two-sided level of each look of a group-sequential design with Pocock's
/// constant boundary (Pocock 1977; Jennison & Turnbull 2000, Sec. 2.2): verdicts read at the seed
/// counts `looks` (each look's test statistic `Z_k` at its count; more seeds between looks), an
/// effect declared at a look where `|Z_k| ≥ c`, with `c` such that under no effect
/// `P(|Z_k| ≥ c at some look) = alpha`. The looks' statistics are those of a Brownian motion
/// observed at the counts (`corr(Z_j, Z_k) = √(n_j / n_k)`), so `c` follows from the recursive
/// numerical integration of Armitage, McPherson and Rowe (1969) over the continuation region
/// and the level is `P(|Z| ≥ c)`. One look (or none) gives `alpha`; equally spaced looks give
/// Pocock's tabulated levels (2.94% for two at 5%, 2.21% for three, 1.82% for four). Testing at
/// this level only at the last look is valid too, and conservative (its rejections are a
/// subset of the design's). Applied to t-tests, as here, it is the usual nominal-level
/// approximation.
///
/// ```
/// use rankwise::stats::sequential_level;
/// assert_eq!(sequential_level(&[16], 0.05), 0.05);
/// // Read at 8 seeds, then at 16: each look at 2.94% keeps the overall level at 5%.
/// assert!((sequential_level(&[8, 16], 0.05) - 0.0294).abs() < 1e-4);
/// ```
pub fn sequential_level(looks: &[usize], alpha: f64) -> f64 {
    let mut counts: Vec<usize> = looks.iter().copied().filter(|&n| n > 0).collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() <= 1 {
        return alpha;
    }
    // Every comparison of a table asks for the same design (hundreds per paper), and each
    // boundary costs about fifty integrations: compute it once per design and level.
    type Levels = std::collections::HashMap<(Vec<usize>, u64), f64>;
    static LEVELS: std::sync::OnceLock<std::sync::Mutex<Levels>> = std::sync::OnceLock::new();
    let levels = LEVELS.get_or_init(Default::default);
    let key = (counts, alpha.to_bits());
    // A poisoned lock only means another thread panicked mid-insert; its entries are whole.
    let cached = levels
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied();
    if let Some(level) = cached {
        return level;
    }
    let level = pocock_level(&key.0, alpha);
    levels
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, level);
    level
}

/// [`sequential_level`] for increasing, distinct, positive `counts` (at least two).
fn pocock_level(counts: &[usize], alpha: f64) -> f64 {
    let t: Vec<f64> = counts.iter().map(|&n| n as f64).collect();
    // The crossing probability falls as the boundary c rises: bisect for the c where it is alpha.
    let (mut lo, mut hi) = (0.0f64, 10.0f64);
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if crossing_probability(mid, &t) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    crossing_probability(0.5 * (lo + hi), &[1.0])
}

/// `P(|S(t_k)| ≥ c √t_k at some k)` for a standard Brownian motion `S` observed at the
/// increasing times `t`: one minus the mass that stays inside the boundary at every look,
/// carried from look to look by convolving its sub-density with the Gaussian increment
/// (Simpson's rule on a grid over each look's continuation interval).
fn crossing_probability(c: f64, t: &[f64]) -> f64 {
    let density = |x: f64, variance: f64| {
        (-x * x / (2.0 * variance)).exp() / (2.0 * std::f64::consts::PI * variance).sqrt()
    };
    // Points per interval: odd for Simpson, and fine against the narrowest increment (a spacing
    // of at most a tenth of its standard deviation), so the kernel is well resolved.
    let narrowest = t
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(t[0], f64::min)
        .sqrt();
    let widest = 2.0 * c * t[t.len() - 1].sqrt();
    let points = ((widest / (0.1 * narrowest)).ceil() as usize).clamp(201, 4001) | 1;
    let grid = |tk: f64| -> (Vec<f64>, Vec<f64>) {
        let half = c * tk.sqrt();
        let h = 2.0 * half / (points - 1) as f64;
        let x = (0..points).map(|i| -half + i as f64 * h).collect();
        let w = (0..points)
            .map(|i| {
                h / 3.0
                    * match i {
                        0 => 1.0,
                        i if i == points - 1 => 1.0,
                        i if i % 2 == 1 => 4.0,
                        _ => 2.0,
                    }
            })
            .collect();
        (x, w)
    };
    let (mut x, mut w) = grid(t[0]);
    let mut g: Vec<f64> = x.iter().map(|&s| density(s, t[0])).collect();
    for k in 1..t.len() {
        let step = t[k] - t[k - 1];
        let (next_x, next_w) = grid(t[k]);
        g = next_x
            .iter()
            .map(|&s| {
                x.iter()
                    .zip(&w)
                    .zip(&g)
                    .map(|((&u, &wu), &gu)| wu * gu * density(s - u, step))
                    .sum()
            })
            .collect();
        (x, w) = (next_x, next_w);
    }
    1.0 - w.iter().zip(&g).map(|(wi, gi)| wi * gi).sum::<f64>()
}

/// The differences a paired test of `a` and `b` runs on, and which paired test it is; `None`
/// when [`compare`] falls back to [`welch`].
fn pairing(a: &Sample, b: &Sample) -> Option<(Vec<f64>, Test)> {
    let differences =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x - y).collect() };
    match (&a.units, &b.units, &a.seeds, &b.seeds) {
        (Some(ua), Some(ub), _, _) if ua == ub && a.values.len() == b.values.len() && !a.exact => {
            let d = differences(&a.values, &b.values);
            Some(if ua.replicates() >= 2 {
                (ua.replicate_means(&d), Test::PairedReplicates)
            } else {
                (d, Test::PairedUnits)
            })
        }
        (None, None, Some(sa), Some(sb)) if sa == sb && !a.exact && !b.exact => {
            Some((differences(&a.values, &b.values), Test::PairedSeeds))
        }
        _ => None,
    }
}

/// The most seeds [`seeds_to_decide`] looks at.
pub const SEEDS_CAP: usize = 1000;

/// What [`seeds_to_decide`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedsToDecide {
    /// This many seeds per row would reach the level.
    At(usize),
    /// Not within [`SEEDS_CAP`] seeds: the gap is too small for its noise (a tie for any
    /// practical number of seeds).
    Beyond,
    /// The question has no answer here: no gap, no noise estimate (a row with one seed, or rows
    /// without spread), or a paired test over the units of one trained model (more units, not
    /// seeds, would change it).
    NotApplicable,
}

/// How many seeds per row (replicates, for values on [`Units`]) the test [`compare`] makes would
/// need for the observed gap between `a` and `b` to reach two-sided significance at `alpha`,
/// if the mean difference and the noise stayed as measured: the smallest `m ≥ 2` with
/// `|d̄| / (s / √m) ≥ t_{1 − α/2, m − 1}` for a paired test (`s`: the sd of the differences),
/// or with Welch's statistic and degrees of freedom at `m` seeds on each side. At that many
/// seeds a gap of exactly this size is significant about half of the time, so it is a floor
/// for planning, not a promise. See [`SeedsToDecide`] for when no number is given.
///
/// ```
/// use rankwise::stats::{compare, seeds_to_decide, Sample, SeedsToDecide};
/// let seeds: Vec<u64> = (0..4).collect();
/// let a = Sample::new(vec![0.30, 0.34, 0.29, 0.33]).with_seeds(seeds.clone());
/// let b = Sample::new(vec![0.31, 0.31, 0.30, 0.30]).with_seeds(seeds);
/// assert!(compare(&a, &b).p > 0.05); // a gap of 0.01 inside the noise at 4 seeds
/// let SeedsToDecide::At(m) = seeds_to_decide(&a, &b, 0.05) else { panic!() };
/// assert!(m > 4 && m < 30, "{m}");
/// ```
pub fn seeds_to_decide(a: &Sample, b: &Sample, alpha: f64) -> SeedsToDecide {
    // |t| at m seeds and its degrees of freedom, from the measured gap and noise.
    let statistic: Box<dyn Fn(f64) -> (f64, f64)> = match pairing(a, b) {
        Some((_, Test::PairedUnits)) => return SeedsToDecide::NotApplicable,
        Some((d, _)) => {
            let (mean, s) = (d.iter().sum::<f64>() / d.len() as f64, sd(&d));
            // A NaN sd (fewer than two differences) fails `s > 0` too.
            let noisy = s > 0.0;
            if !noisy || mean == 0.0 || !mean.is_finite() {
                return SeedsToDecide::NotApplicable;
            }
            Box::new(move |m| (mean.abs() / s * m.sqrt(), m - 1.0))
        }
        None => {
            let (a, b) = (a.as_seeds(), b.as_seeds());
            let variance = |s: &Sample| if s.exact { 0.0 } else { s.sd().powi(2) };
            let (va, vb) = (variance(&a), variance(&b));
            let gap = (a.mean() - b.mean()).abs();
            let noisy = va + vb > 0.0;
            if !noisy || gap == 0.0 || !gap.is_finite() {
                return SeedsToDecide::NotApplicable;
            }
            // Welch–Satterthwaite with m seeds on each side: (va + vb)² (m − 1) / (va² + vb²).
            let df_per = (va + vb).powi(2) / (va * va + vb * vb);
            Box::new(move |m| (gap / ((va + vb) / m).sqrt(), df_per * (m - 1.0)))
        }
    };
    let significant = |m: usize| {
        let (t, df) = statistic(m as f64);
        t >= t_quantile(1.0 - alpha / 2.0, df)
    };
    if !significant(SEEDS_CAP) {
        return SeedsToDecide::Beyond;
    }
    // |t| grows and the critical value falls with m: bisect for the first significant m.
    let (mut lo, mut hi) = (1, SEEDS_CAP);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if significant(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    SeedsToDecide::At(hi)
}

/// Two measurements of the same units (queries, episodes) compared unit by unit: the mean of
/// the differences `d_u = a_u − b_u`, its 95% interval and the p-value of the paired t-test of
/// `mean(d) = 0` ([`paired_t`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedT {
    /// `mean(d)`.
    pub mean: f64,
    /// `mean(d) ± t_{0.975, n−1} · sd(d) / √n` ([`Sample::ci95`]): NaN with fewer than two
    /// differences, the point itself when every difference is the same.
    pub interval: (f64, f64),
    /// The two-sided p-value (1 with fewer than two differences; 0 or 1 when every difference
    /// is the same: certain, or none).
    pub p: f64,
    /// The number of differences.
    pub n: usize,
}

impl PairedT {
    /// Whether the mean difference is non-zero beyond the units' noise: `p <` [`ALPHA`].
    pub fn significant(&self) -> bool {
        self.p < ALPHA
    }
}

/// A p-value to read: three decimals, or one significant digit and the exponent below 0.001
/// (what `rankwise compare`, `eval --versus` and `tune` print).
///
/// ```
/// use rankwise::stats::format_p;
/// assert_eq!((format_p(0.0131), format_p(7.04e-4)), ("0.013".to_string(), "7.0e-4".to_string()));
/// ```
pub fn format_p(p: f64) -> String {
    if p >= 1e-3 {
        format!("{p:.3}")
    } else {
        format!("{p:.1e}")
    }
}

/// The paired t-test of the differences `d` (one per shared unit) against 0, with `n − 1`
/// degrees of freedom — the claims' test over shared units ([`Test::PairedUnits`]) — and the
/// 95% interval of their mean.
///
/// ```
/// use rankwise::stats::paired_t;
/// // d = (1, 0, 1, 0, 1): mean 0.6, se √0.06, t = 2.449 with 4 df, p = 0.0705.
/// let t = paired_t(&[1.0, 0.0, 1.0, 0.0, 1.0]);
/// assert!((t.mean - 0.6).abs() < 1e-12 && (t.p - 0.0705).abs() < 5e-4);
/// assert!(!t.significant() && t.interval.0 < 0.0 && t.interval.1 > 0.6);
/// ```
pub fn paired_t(d: &[f64]) -> PairedT {
    let test = paired(d, Test::PairedUnits);
    let half = Sample::new(d.to_vec()).ci95();
    PairedT {
        mean: test.difference,
        interval: (test.difference - half, test.difference + half),
        p: test.p,
        n: d.len(),
    }
}

/// The one-sample t-test of the paired differences `d` against 0 (`n − 1` degrees of freedom);
/// `p = 1` below two differences, and a constant non-zero difference is certain (`p = 0`).
fn paired(d: &[f64], test: Test) -> Comparison {
    let n = d.len();
    let difference = d.iter().sum::<f64>() / n as f64;
    let p = if n < 2 || !difference.is_finite() {
        1.0
    } else {
        let se = sd(d) / (n as f64).sqrt();
        if se == 0.0 {
            if difference == 0.0 {
                1.0
            } else {
                0.0
            }
        } else {
            two_sided_p(difference / se, (n - 1) as f64)
        }
    };
    Comparison {
        difference,
        p,
        test,
        level: ALPHA,
    }
}

/// The exponent `b` of a power law `y = c · x^b` fitted by least squares on `(ln x, ln y)` over
/// every `(x, y)` of `points` (each `x` with its repeated `y`s), with the half-width of its 95%
/// interval (Student's t, `N − 2` degrees of freedom). `None` with fewer than two distinct `x`,
/// fewer than three points, or a non-positive value.
pub fn power_law_exponent(points: &[(f64, Vec<f64>)]) -> Option<(f64, f64)> {
    let xy: Vec<(f64, f64)> = points
        .iter()
        .flat_map(|(x, ys)| ys.iter().map(move |y| (*x, *y)))
        .collect();
    if xy
        .iter()
        .any(|(x, y)| *x <= 0.0 || *y <= 0.0 || !x.is_finite() || !y.is_finite())
    {
        return None;
    }
    let n = xy.len();
    let logs: Vec<(f64, f64)> = xy.iter().map(|(x, y)| (x.ln(), y.ln())).collect();
    if n < 3 {
        return None;
    }
    let fit = LineFit::new(&logs)?;
    let b = fit.slope;
    let sse: f64 = logs
        .iter()
        .map(|p| (p.1 - fit.mean_y - b * (p.0 - fit.mean_x)).powi(2))
        .sum();
    let df = (n - 2) as f64;
    let se = (sse / df / fit.sxx).sqrt();
    Some((b, t_quantile(1.0 - ALPHA / 2.0, df) * se))
}

/// The least-squares line `y = mean_y + slope · (x − mean_x)` through `(x, y)` points, with the
/// sums its standard errors need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LineFit {
    /// `Σ (x − x̄)(y − ȳ) / Σ (x − x̄)²`.
    pub slope: f64,
    /// `x̄`.
    pub mean_x: f64,
    /// `ȳ`.
    pub mean_y: f64,
    /// `Σ (x − x̄)²`.
    pub sxx: f64,
}

impl LineFit {
    /// The fit of `points`; `None` when they have no spread in `x` (fewer than two distinct
    /// `x`, or none).
    ///
    /// ```
    /// use rankwise::stats::LineFit;
    /// let fit = LineFit::new(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
    /// assert!((fit.slope - 2.0).abs() < 1e-12 && (fit.mean_y - 3.0).abs() < 1e-12);
    /// assert_eq!(LineFit::new(&[(1.0, 0.0), (1.0, 2.0)]), None);
    /// ```
    pub fn new(points: &[(f64, f64)]) -> Option<Self> {
        let n = points.len() as f64;
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
        // NaN: no points.
        if sxx.is_nan() || sxx <= 0.0 {
            return None;
        }
        let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
        Some(LineFit {
            slope: sxy / sxx,
            mean_x,
            mean_y,
            sxx,
        })
    }
}

/// `P(|T| ≥ |t|)` for Student's t with `df` degrees of freedom: `I_{df/(df+t²)}(df/2, 1/2)`.
pub fn two_sided_p(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return 0.0;
    }
    regularized_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// The `q`-quantile of Student's t with `df` degrees of freedom (`0 < q < 1`), by bisection on
/// the distribution function.
pub fn t_quantile(q: f64, df: f64) -> f64 {
    if q == 0.5 {
        return 0.0;
    }
    // P(T ≤ t) for t > 0 is 1 − p/2.
    let upper = q > 0.5;
    let target = if upper { 2.0 * (1.0 - q) } else { 2.0 * q };
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while two_sided_p(hi, df) > target {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if two_sided_p(mid, df) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let t = 0.5 * (lo + hi);
    if upper {
        t
    } else {
        -t
    }
}

/// `ln Γ(x)` for `x > 0` (Lanczos approximation, g = 7, 9 coefficients; relative error
/// below 1e-15 on the arguments used here).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1 − x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised incomplete beta function `I_x(a, b)`, by its continued fraction (evaluated
/// with the modified Lentz method on whichever of `x` and `1 − x` converges faster).
fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The continued fraction of `I_x(a, b)` (modified Lentz).
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..500 {
        let m = m as f64;
        // The even step, then the odd step of the fraction.
        for num in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + num / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-16 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_published_table() {
        // t_{0.975, df} as scipy.stats.t.ppf(0.975, df) gives them.
        for (df, t) in [
            (1.0, 12.706_204_736_174_694),
            (2.0, 4.302_652_729_749_462),
            (4.0, 2.776_445_105_197_793_4),
            (10.0, 2.228_138_851_986_274),
            (30.0, 2.042_272_456_301_237_8),
            (1000.0, 1.962_339_080_826_408_3),
        ] {
            let got = t_quantile(0.975, df);
            assert!((got - t).abs() < 1e-9, "df {df}: {got} vs {t}");
            assert!((t_quantile(0.025, df) + t).abs() < 1e-9);
            assert!((two_sided_p(t, df) - 0.05).abs() < 1e-12, "df {df}");
        }
        // A t of 0 is no evidence; a huge t is.
        assert_eq!(two_sided_p(0.0, 3.0), 1.0);
        assert!(two_sided_p(1e6, 3.0) < 1e-12);
        // ln Γ at integers and at ½.
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-13);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
    }

    #[test]
    fn samples_have_a_mean_sd_and_interval() {
        let s = Sample::new(vec![1.0, 2.0, 3.0]);
        assert_eq!(s.mean(), 2.0);
        assert!((s.sd() - 1.0).abs() < 1e-15);
        // t_{0.975, 2} · 1 / √3.
        assert!((s.ci95() - 4.302_652_729_749_464 / 3f64.sqrt()).abs() < 1e-9);
        assert!(Sample::new(vec![1.0]).ci95().is_nan());
    }

    #[test]
    fn welch_separates_a_real_gap_from_noise() {
        // scipy.stats.ttest_ind(a, b, equal_var=False): t = −3.966662776877729,
        // df = 5.993530503798302, p = 0.007411272386704016.
        let a = Sample::new(vec![19.8, 20.4, 19.6, 17.8, 18.5, 18.9]);
        let b = Sample::new(vec![28.2, 26.6, 20.1, 23.3, 25.2, 22.1]);
        let c = welch(&a, &b);
        assert!(c.b_larger() && !c.a_larger(), "{c:?}");
        let (va, vb) = (a.sd().powi(2) / 6.0, b.sd().powi(2) / 6.0);
        let t = (a.mean() - b.mean()) / (va + vb).sqrt();
        let df = (va + vb).powi(2) / (va * va / 5.0 + vb * vb / 5.0);
        assert!((c.p - two_sided_p(t, df)).abs() < 1e-15);
        assert!((t + 3.966_662_776_877_729).abs() < 1e-12, "{t}");
        assert!((df - 5.993_530_503_798_302).abs() < 1e-12, "{df}");
        assert!((c.p - 0.007_411_272_386_704_016).abs() < 1e-12, "{}", c.p);
        // A gap well inside the spread is not significant, in either direction (scipy:
        // p = 0.5733922538253555).
        let d = welch(
            &Sample::new(vec![0.50, 0.52, 0.48]),
            &Sample::new(vec![0.51, 0.47, 0.49]),
        );
        assert!(!d.a_larger() && !d.b_larger(), "{d:?}");
        assert!((d.p - 0.573_392_253_825_355_5).abs() < 1e-12, "{}", d.p);
        // One seed says nothing about the noise; constant samples are exact.
        let one = Sample::new(vec![0.9]);
        assert_eq!(welch(&one, &Sample::new(vec![0.1, 0.2])).p, 1.0);
        let hi = Sample::new(vec![0.3, 0.3]);
        let lo = Sample::new(vec![0.2, 0.2]);
        assert!(welch(&hi, &lo).a_larger());
        assert_eq!(welch(&hi, &hi).p, 1.0);
        // Against an exact value: the one-sample t-test with n − 1 degrees of freedom.
        let exact = Sample::exact(20.0);
        let e = welch(&a, &exact);
        let t = (a.mean() - 20.0) / (a.sd() / 6f64.sqrt());
        assert!((e.p - two_sided_p(t, 5.0)).abs() < 1e-15, "{e:?}");
        // 19.17 against 20 with a spread of 0.9 over 6 values: p ≈ 0.084, not significant.
        assert!(!e.b_larger() && (e.p - 0.0839).abs() < 1e-3, "{e:?}");
        assert_eq!(welch(&exact, &Sample::exact(20.0)).p, 1.0);
        assert_eq!(welch(&Sample::exact(21.0), &exact).p, 0.0);
    }

    #[test]
    fn power_laws_are_fitted_in_log_log() {
        // y = 3 x² exactly: b = 2 with no spread.
        let exact: Vec<(f64, Vec<f64>)> = [1.0, 10.0, 100.0]
            .iter()
            .map(|&x| (x, vec![3.0 * x * x, 3.0 * x * x]))
            .collect();
        let (b, ci) = power_law_exponent(&exact).unwrap();
        assert!((b - 2.0).abs() < 1e-12 && ci.abs() < 1e-9, "{b} {ci}");
        // numpy.polyfit(log x, log y, 1) on x = 1, 1, 10, 10, y = 1, 2, 10, 30:
        // slope = 1.088045629527841 (= ln 150 / (2 ln 10)).
        let noisy = vec![(1.0, vec![1.0, 2.0]), (10.0, vec![10.0, 30.0])];
        let (b, ci) = power_law_exponent(&noisy).unwrap();
        let expect = ((10f64.ln() + 30f64.ln()) - 2f64.ln()) / 2.0 / 10f64.ln();
        assert!((b - expect).abs() < 1e-12, "{b} {expect}");
        assert!((b - 1.088_045_629_527_841).abs() < 1e-12, "{b}");
        assert!(ci > 0.0);
        assert!(power_law_exponent(&[(1.0, vec![1.0, 2.0, 3.0])]).is_none());
        assert!(power_law_exponent(&[(1.0, vec![1.0]), (2.0, vec![0.0])]).is_none());
    }

    #[test]
    fn shared_units_are_compared_pairwise() {
        // Two methods on the same 8 episodes: a consistent +0.01 on episodes whose own
        // difficulty varies by ±0.2. Unpaired, the gap drowns in the episodes' spread; paired,
        // it is clear. scipy.stats.ttest_rel(a, b): t = 4.732863826479693,
        // p = 0.0021254521977627926 (ttest_ind(…, equal_var=False): p = 0.9366895524936303).
        let base = [0.5, 0.9, 0.3, 0.7, 0.6, 0.2, 0.8, 0.4];
        let bumps = [0.01, 0.02, 0.0, 0.01, 0.015, 0.005, 0.01, 0.01];
        let a: Vec<f64> = base.iter().zip(&bumps).map(|(x, d)| x + d).collect();
        let units = Units::new("episodes", 1, 8);
        let (sa, sb) = (
            Sample::on_units(a.clone(), units.clone()),
            Sample::on_units(base.to_vec(), units.clone()),
        );
        let unpaired = welch(&sa, &sb);
        assert_eq!(unpaired.test, Test::Welch);
        assert!(unpaired.p > 0.9, "{unpaired:?}");
        let paired = compare(&sa, &sb);
        assert_eq!(paired.test, Test::PairedUnits);
        let d: Vec<f64> = bumps.to_vec();
        let t = (d.iter().sum::<f64>() / 8.0) / (sd(&d) / 8f64.sqrt());
        assert!((paired.p - two_sided_p(t, 7.0)).abs() < 1e-15, "{paired:?}");
        assert!(
            paired.a_larger() && (t - 4.732_863_826_479_693).abs() < 1e-9,
            "{t}"
        );
        assert!(
            (paired.p - 0.002_125_452_197_762_793).abs() < 1e-12,
            "{}",
            paired.p
        );
        assert!(
            (unpaired.p - 0.936_689_552_493_630_3).abs() < 1e-9,
            "{}",
            unpaired.p
        );
        // Other units (another episode set): no pairing, Welch as for seeds.
        let other = Sample::on_units(base.to_vec(), Units::new("other episodes", 1, 8));
        assert_eq!(compare(&sa, &other).test, Test::Welch);
    }

    #[test]
    fn rows_run_with_the_same_seeds_are_compared_seed_by_seed() {
        // Five seeds whose own luck moves both rows (±0.04) and a consistent gain of 0.01–0.02.
        // scipy.stats.ttest_rel(a, b): t = 6.708203932499369, p = 0.0025702607653999305;
        // ttest_ind(a, b, equal_var=False): p = 0.4280278207836671.
        let b = vec![0.26, 0.29, 0.21, 0.27, 0.24];
        let a = vec![0.275, 0.30, 0.23, 0.28, 0.26];
        let seeds = vec![0, 1, 2, 3, 4];
        let sa = Sample::new(a.clone()).with_seeds(seeds.clone());
        let sb = Sample::new(b.clone()).with_seeds(seeds.clone());
        let c = compare(&sa, &sb);
        assert_eq!(c.test, Test::PairedSeeds);
        assert!((c.p - 0.002_570_260_765_399_930_5).abs() < 1e-12, "{c:?}");
        assert!(
            c.a_larger() && (c.difference - 0.015).abs() < 1e-12,
            "{c:?}"
        );
        let unpaired = welch(&sa, &sb);
        assert!(
            (unpaired.p - 0.428_027_820_783_667_1).abs() < 1e-9,
            "{unpaired:?}"
        );
        // The pairing only follows the seeds: other seeds, seeds on one side only, a seed list
        // of the wrong length or an exact value leave Welch's test.
        let shifted = Sample::new(b.clone()).with_seeds(vec![5, 6, 7, 8, 9]);
        assert_eq!(compare(&sa, &shifted).test, Test::Welch);
        assert_eq!(compare(&sa, &Sample::new(b.clone())).test, Test::Welch);
        assert_eq!(Sample::new(b.clone()).with_seeds(vec![0, 1]).seeds, None);
        assert_eq!(compare(&sa, &Sample::exact(0.2)).test, Test::Welch);
        // A row equal to the other on every seed: no difference (p = 1); a constant non-zero
        // difference is certain.
        assert_eq!(compare(&sb, &sb.clone()).p, 1.0);
        let plus: Vec<f64> = b.iter().map(|x| x + 0.25).collect();
        let plus = Sample::new(plus).with_seeds(seeds.clone());
        assert!(compare(&plus, &sb).p < 1e-12);
        // One seed says nothing about the noise.
        let one = |v: f64| Sample::new(vec![v]).with_seeds(vec![0]);
        assert_eq!(compare(&one(0.3), &one(0.2)).p, 1.0);
    }

    #[test]
    fn several_replicates_test_each_replicates_mean_difference() {
        // 3 seeds × 4 queries. The per-seed mean differences are 0.02, 0.03, 0.01: the test is
        // the one-sample t-test of those three (2 degrees of freedom), and the sample's n, mean
        // and interval are over the seeds' means.
        let units = Units::new("queries", 3, 4);
        assert_eq!(units.replicates(), 3);
        let b = vec![0.2, 0.4, 0.6, 0.8, 0.1, 0.3, 0.5, 0.7, 0.3, 0.5, 0.7, 0.9];
        let shift = [0.02, 0.03, 0.01];
        let a: Vec<f64> = b
            .iter()
            .enumerate()
            .map(|(i, v)| v + shift[i / 4])
            .collect();
        let (sa, sb) = (
            Sample::on_units(a, units.clone()),
            Sample::on_units(b, units),
        );
        assert_eq!(sb.n(), 3);
        assert_eq!(sb.replicates().as_ref(), &[0.5, 0.4, 0.6][..]);
        assert!((sb.mean() - 0.5).abs() < 1e-12);
        let c = compare(&sa, &sb);
        assert_eq!(c.test, Test::PairedReplicates);
        let t = 0.02 / (0.01 / 3f64.sqrt());
        assert!((c.p - two_sided_p(t, 2.0)).abs() < 1e-9, "{c:?}");
        // scipy.stats.ttest_1samp([0.02, 0.03, 0.01], 0): p = 0.07417990022744854 — a
        // consistent gain over only three seeds is not yet significant.
        assert!((c.p - 0.074_179_900_227_448_54).abs() < 1e-9, "{}", c.p);
        assert!(!c.a_larger());
    }

    /// `m` seeds whose values have exactly mean `mean` and sample sd `s` (a symmetric pattern).
    fn exact_moments(m: usize, mean: f64, s: f64) -> Vec<f64> {
        let z: Vec<f64> = (0..m).map(|i| i as f64 - (m - 1) as f64 / 2.0).collect();
        let zs = sd(&z);
        z.iter().map(|v| mean + s * v / zs).collect()
    }

    #[test]
    fn seeds_to_decide_is_where_the_same_gap_and_noise_turn_significant() {
        // A paired gap of 0.0084 with a seed-difference sd of 0.0136 (HAPPIER_F vs HAPPIER,
        // fine R@1, at standard): measured on 8 seeds, p ≈ 0.13.
        let (gap, noise) = (0.0084, 0.0136);
        let on = |m: usize| {
            let seeds: Vec<u64> = (0..m as u64).collect();
            let a = Sample::new(exact_moments(m, gap, noise)).with_seeds(seeds.clone());
            let b = Sample::new(vec![0.0; m]).with_seeds(seeds);
            (a, b)
        };
        let (a, b) = on(8);
        let at = |a: &Sample, b: &Sample, alpha: f64| match seeds_to_decide(a, b, alpha) {
            SeedsToDecide::At(m) => m,
            other => panic!("{other:?}"),
        };
        let m = at(&a, &b, ALPHA);
        // Brute force: the same moments over m seeds reach p < 5%, over m − 1 they do not.
        let p = |m: usize| {
            let (a, b) = on(m);
            compare(&a, &b).p
        };
        assert!(
            p(m) < ALPHA && p(m - 1) >= ALPHA,
            "m {m}: {} {}",
            p(m),
            p(m - 1)
        );
        // scipy: the first n with 0.0084 / (0.0136 / √n) ≥ t.ppf(0.975, n − 1) is 13.
        assert_eq!(m, 13);
        // The answer depends on the gap and noise, not on how many seeds measured them; a
        // stricter level needs more seeds.
        let (a12, b12) = on(12);
        assert_eq!(seeds_to_decide(&a12, &b12, ALPHA), SeedsToDecide::At(13));
        assert!(at(&a, &b, ALPHA / 4.0) > m);
        // Already significant: at most the seeds measured.
        let (a30, b30) = on(30);
        assert!(compare(&a30, &b30).p < ALPHA);
        assert!(at(&a30, &b30, ALPHA) <= 30);
        // A gap a thousand times smaller than its noise, no gap, no noise estimate: none.
        let tiny = Sample::new(exact_moments(8, 1e-5, 0.0136)).with_seeds((0..8).collect());
        assert_eq!(seeds_to_decide(&tiny, &b, ALPHA), SeedsToDecide::Beyond);
        assert_eq!(seeds_to_decide(&b, &b, ALPHA), SeedsToDecide::NotApplicable);
        let one = Sample::new(vec![0.3]).with_seeds(vec![0]);
        let other = Sample::new(vec![0.2]).with_seeds(vec![0]);
        assert_eq!(
            seeds_to_decide(&one, &other, ALPHA),
            SeedsToDecide::NotApplicable
        );
    }

    #[test]
    fn seeds_to_decide_follows_welch_and_skips_a_single_model() {
        // Unpaired rows (no seeds), equal spread 0.02 and a gap of 0.01: Welch's statistic at m
        // seeds a side is 0.01 / √(2 · 0.02² / m) with 2 (m − 1) degrees of freedom.
        let a = Sample::new(exact_moments(6, 0.31, 0.02));
        let b = Sample::new(exact_moments(6, 0.30, 0.02));
        let at = |a: &Sample, b: &Sample| match seeds_to_decide(a, b, ALPHA) {
            SeedsToDecide::At(m) => m,
            other => panic!("{other:?}"),
        };
        let m = at(&a, &b);
        let p = |m: usize| {
            welch(
                &Sample::new(exact_moments(m, 0.31, 0.02)),
                &Sample::new(exact_moments(m, 0.30, 0.02)),
            )
            .p
        };
        assert!(p(m) < ALPHA && p(m - 1) >= ALPHA, "m {m}");
        // Against an exact value, the test is one-sample over the noisy side.
        let exact = Sample::exact(0.30);
        let m1 = at(&a, &exact);
        let p1 = |m: usize| welch(&Sample::new(exact_moments(m, 0.31, 0.02)), &exact).p;
        assert!(p1(m1) < ALPHA && p1(m1 - 1) >= ALPHA, "m {m1}");
        // One trained model's test units: more seeds are not what would decide it.
        let units = Units::new("episodes", 1, 4);
        let (ua, ub) = (
            Sample::on_units(vec![0.5, 0.6, 0.4, 0.7], units.clone()),
            Sample::on_units(vec![0.49, 0.61, 0.38, 0.69], units),
        );
        assert_eq!(
            seeds_to_decide(&ua, &ub, ALPHA),
            SeedsToDecide::NotApplicable
        );
    }

    #[test]
    fn sequential_levels_match_pococks_constants() {
        // Nominal level 2·(1 − Φ(c)) of Pocock's constant c for K equally spaced looks at 5%
        // (Jennison & Turnbull 2000, Table 2.1: c = 2.178, 2.289, 2.361, 2.413), and for our
        // looks as scipy's multivariate normal gives them (bisection on
        // 1 − P(|Z_k| < c ∀k), corr(Z_j, Z_k) = √(n_j / n_k)).
        for (looks, level) in [
            (vec![1, 2], 0.029_385_785_866),
            (vec![1, 2, 3], 0.022_051_751_654),
            (vec![1, 2, 3, 4], 0.018_211_919_211),
            (vec![1, 2, 3, 4, 5], 0.015_813_558_529),
            (vec![8, 16], 0.029_385_785_866),
            (vec![6, 10], 0.030_732_495_505),
            (vec![3, 5, 8, 16], 0.017_059_085_770),
        ] {
            let got = sequential_level(&looks, ALPHA);
            assert!((got - level).abs() < 2e-6, "{looks:?}: {got} vs {level}");
        }
        // One look is the plain level; repeats and order do not count as looks.
        assert_eq!(sequential_level(&[], ALPHA), ALPHA);
        assert_eq!(sequential_level(&[16], ALPHA), ALPHA);
        assert_eq!(
            sequential_level(&[16, 8, 8], ALPHA),
            sequential_level(&[8, 16], ALPHA)
        );
        // Each added look lowers the level.
        assert!(sequential_level(&[3, 5, 8, 16], ALPHA) < sequential_level(&[5, 8, 16], ALPHA));
    }

    #[test]
    fn looks_lower_the_level_a_comparison_is_held_to() {
        // Eight seeds whose paired differences give p = 0.048 (scipy): significant at 5%, not at the
        // 2.94% of a second look (read at 4 seeds before).
        let seeds: Vec<u64> = (0..8).collect();
        let b = Sample::new(vec![0.30; 8]).with_seeds(seeds.clone());
        let a =
            Sample::new(vec![0.31, 0.29, 0.33, 0.305, 0.32, 0.31, 0.30, 0.325]).with_seeds(seeds);
        let plain = compare(&a, &b);
        assert!(plain.p > 0.0294 && plain.p < ALPHA, "{}", plain.p);
        assert!(plain.a_larger() && plain.level == ALPHA);
        let looked = compare(
            &a.clone().with_looks(vec![4, 8]),
            &b.clone().with_looks(vec![4, 8]),
        );
        assert_eq!(looked.p, plain.p);
        assert!((looked.level - 0.029_385_785_866).abs() < 2e-6 && !looked.a_larger());
        // Looks at or above the comparison's seed count are not earlier looks.
        assert_eq!(compare(&a.clone().with_looks(vec![8, 16]), &b).level, ALPHA);
        // Values that are not one per seed (batch draws, timings) take no looks.
        assert!(Sample::new(vec![0.1, 0.2, 0.3])
            .with_looks(vec![2, 3])
            .looks
            .is_empty());
        // One model's test units are not seeds: no look applies.
        let units = Units::new("episodes", 1, 4);
        let ua = Sample::on_units(vec![0.5, 0.6, 0.4, 0.7], units.clone()).with_looks(vec![2]);
        let ub = Sample::on_units(vec![0.49, 0.61, 0.38, 0.69], units).with_looks(vec![2]);
        assert_eq!(compare(&ua, &ub).level, ALPHA);
    }
}

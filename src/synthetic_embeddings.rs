//! A synthetic evaluation set shaped like the Stanford Online Products (SOP) test split, for
//! trying the evaluation end to end without a trained model or a dataset.
//!
//! Shape (the defaults of [`SyntheticSpec::sop`]): 60,502 items in 11,316 fine classes of 2 to
//! 12 images each (mean 5.35, skewed towards small classes as in SOP), grouped into 12 coarse
//! classes of unequal sizes, embedded in D = 512 dimensions. Labels are `[class_id,
//! super_class_id]`, finest first, the items listed class by class as in SOP's `Ebay_test.txt`.
//!
//! Each embedding is an L2-normalised noisy mixture
//! `x = normalise(a·u_coarse + b·v_fine + s_i·n_i)`, with the class centres `u`, `v` and the noise
//! `n_i` drawn from `N(0, I/D)` (norm ≈ 1) and a per-item noise scale `s_i = s·exp(σ·z_i)` so some
//! items are harder than others. The preset weights were tuned so that the set scores like a
//! trained model on SOP (HAPPIER reports R@1 = 81.0 there). Measured with
//! `rankwise eval --example sop` (seed 0, all 60,502 queries): R@1 = 0.797, R@10 = 0.917,
//! R@100 = 0.971, R@1000 = 0.993, mAP@R = 0.455, H-AP = 0.547; and `--example small`: R@1 =
//! 0.758. Most first-rank mistakes stay inside the coarse class (super-class R@1 = 0.989 and
//! 0.977), which is what makes the hierarchical metrics (H-AP, ASI, NDCG) differ from the binary
//! ones.
//!
//! Everything is a deterministic function of the seed, whatever the number of threads: each
//! item draws from its own ChaCha8 stream.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma, StandardNormal};
use rayon::prelude::*;
use std::fmt;
use std::str::FromStr;

/// RNG stream of the class structure (sizes, coarse groups).
const STREAM_STRUCTURE: u64 = 0;
/// RNG stream of the class centres.
const STREAM_CENTRES: u64 = 1;
/// Item `i` draws from stream `STREAM_ITEMS + i`.
const STREAM_ITEMS: u64 = 2;

/// Shape parameter of the Gamma draw that sets the relative sizes of the coarse classes (a
/// coefficient of variation of 1/√3 ≈ 0.58: unequal, as SOP's super-classes are).
const COARSE_SIZE_SHAPE: f64 = 3.0;

/// Named sizes of the synthetic set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// 600 items, 112 fine classes, 12 coarse classes, D = 64: for the README, tests and a
    /// first look (evaluates in well under a second).
    Small,
    /// The size of the SOP test split: 60,502 items, 11,316 fine classes, 12 coarse classes,
    /// D = 512.
    Sop,
}

impl FromStr for Preset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "small" => Ok(Preset::Small),
            "sop" => Ok(Preset::Sop),
            other => Err(Error::invalid(
                "preset",
                format!("'{other}' is not a preset; use 'small' or 'sop'"),
            )),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Preset::Small => "small",
            Preset::Sop => "sop",
        })
    }
}

/// Everything that defines a synthetic set.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// Number of items `N`.
    pub num_items: usize,
    /// Number of fine classes (products).
    pub num_fine_classes: usize,
    /// Number of coarse classes (product categories).
    pub num_coarse_classes: usize,
    /// Embedding dimension `D`.
    pub dim: usize,
    /// Smallest fine class (SOP test: 2).
    pub min_class_size: usize,
    /// Largest fine class (SOP test: 12).
    pub max_class_size: usize,
    /// Weight `a` of the coarse-class centre.
    pub coarse_weight: f32,
    /// Weight `b` of the fine-class centre.
    pub fine_weight: f32,
    /// Median noise scale `s`.
    pub noise: f32,
    /// Log-normal spread `σ` of the per-item noise scale (0: every item equally noisy).
    pub noise_spread: f32,
    /// Seed of every random draw.
    pub seed: u64,
}

/// A generated set: embeddings and their two-level labels.
#[derive(Debug, Clone)]
pub struct SyntheticSet {
    /// `N × D` f32, rows of unit L2 norm, on the CPU.
    pub embeddings: Tensor,
    /// `N × 2` labels `[class_id, super_class_id]`.
    pub labels: Labels,
    /// `["class_id", "super_class_id"]`, SOP's column names.
    pub level_names: Vec<String>,
}

impl SyntheticSpec {
    /// The spec of a preset.
    pub fn preset(preset: Preset) -> Self {
        match preset {
            Preset::Small => Self::small(),
            Preset::Sop => Self::sop(),
        }
    }

    /// The size of the SOP test split (see [`Preset::Sop`]).
    pub fn sop() -> Self {
        SyntheticSpec {
            num_items: 60_502,
            num_fine_classes: 11_316,
            num_coarse_classes: 12,
            dim: 512,
            min_class_size: 2,
            max_class_size: 12,
            coarse_weight: 0.25,
            fine_weight: 0.345,
            noise: 0.8,
            noise_spread: 0.25,
            seed: 0,
        }
    }

    /// A small set with SOP's class sizes and 12 coarse classes (see [`Preset::Small`]).
    pub fn small() -> Self {
        SyntheticSpec {
            num_items: 600,
            num_fine_classes: 112,
            dim: 64,
            // In 64 dimensions the noise spreads the scores more, and 600 items put fewer
            // impostors in front of each query, than in the SOP preset: other weights give a
            // similar R@1.
            coarse_weight: 0.55,
            fine_weight: 0.42,
            noise: 0.75,
            ..Self::sop()
        }
    }

    /// The same spec with another seed.
    pub fn with_seed(self, seed: u64) -> Self {
        SyntheticSpec { seed, ..self }
    }

    /// Errors (naming the field) unless the classes can hold exactly `num_items` items and the
    /// weights are usable.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("num_items", self.num_items),
            ("num_fine_classes", self.num_fine_classes),
            ("num_coarse_classes", self.num_coarse_classes),
            ("dim", self.dim),
            ("min_class_size", self.min_class_size),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid(*field, "must be at least 1"));
        }
        if self.max_class_size < self.min_class_size {
            return Err(Error::invalid(
                "max_class_size",
                format!(
                    "{} is below min_class_size {}",
                    self.max_class_size, self.min_class_size
                ),
            ));
        }
        let (lo, hi) = (
            self.num_fine_classes * self.min_class_size,
            self.num_fine_classes * self.max_class_size,
        );
        if self.num_items < lo || self.num_items > hi {
            return Err(Error::invalid(
                "num_items",
                format!(
                    "{} items cannot fill {} classes of {}..={} items ({lo}..={hi} items)",
                    self.num_items, self.num_fine_classes, self.min_class_size, self.max_class_size
                ),
            ));
        }
        if self.num_coarse_classes > self.num_fine_classes {
            return Err(Error::invalid(
                "num_coarse_classes",
                format!(
                    "{} coarse classes need at least as many fine classes (got {})",
                    self.num_coarse_classes, self.num_fine_classes
                ),
            ));
        }
        let weights = [
            ("coarse_weight", self.coarse_weight),
            ("fine_weight", self.fine_weight),
            ("noise", self.noise),
            ("noise_spread", self.noise_spread),
        ];
        if let Some((field, v)) = weights.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
            return Err(Error::invalid(
                *field,
                format!("must be finite and ≥ 0, got {v}"),
            ));
        }
        if self.coarse_weight + self.fine_weight + self.noise == 0.0 {
            return Err(Error::invalid(
                "noise",
                "the coarse, fine and noise weights are all 0: every embedding would be zero",
            ));
        }
        Ok(())
    }

    /// Generates the set (see the module documentation).
    pub fn generate(&self) -> Result<SyntheticSet> {
        self.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(STREAM_STRUCTURE);
        let sizes = fine_class_sizes(self, &mut rng);
        let coarse_of_fine = coarse_class_of_fine(self, &mut rng)?;

        let mut rows = Vec::with_capacity(self.num_items * 2);
        let mut item_classes = Vec::with_capacity(self.num_items);
        for (c, &size) in sizes.iter().enumerate() {
            for _ in 0..size {
                rows.extend_from_slice(&[c as ClassId, coarse_of_fine[c] as ClassId]);
                item_classes.push((c, coarse_of_fine[c]));
            }
        }
        let labels = Labels::from_flat(self.num_items, 2, rows)?;

        let d = self.dim;
        let mut centre_rng = ChaCha8Rng::seed_from_u64(self.seed);
        centre_rng.set_stream(STREAM_CENTRES);
        let coarse_centres = gaussian_rows(self.num_coarse_classes, d, &mut centre_rng);
        let fine_centres = gaussian_rows(self.num_fine_classes, d, &mut centre_rng);

        let mut data = vec![0f32; self.num_items * d];
        data.par_chunks_mut(d)
            .zip(item_classes.par_iter())
            .enumerate()
            .for_each(|(i, (x, &(fine, coarse)))| {
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
                rng.set_stream(STREAM_ITEMS + i as u64);
                let z: f32 = rng.sample(StandardNormal);
                let s = self.noise * (self.noise_spread * z).exp();
                let u = &coarse_centres[coarse * d..(coarse + 1) * d];
                let v = &fine_centres[fine * d..(fine + 1) * d];
                let scale = (d as f32).sqrt().recip();
                for ((xj, uj), vj) in x.iter_mut().zip(u).zip(v) {
                    let n: f32 = rng.sample::<f32, _>(StandardNormal) * scale;
                    *xj = self.coarse_weight * uj + self.fine_weight * vj + s * n;
                }
                normalise(x);
            });
        let embeddings = Tensor::from_vec(data, (self.num_items, d), &Device::Cpu)?;
        Ok(SyntheticSet {
            embeddings,
            labels,
            level_names: vec!["class_id".to_string(), "super_class_id".to_string()],
        })
    }
}

/// `rows × d` values from `N(0, 1/d)`, row-major: rows of norm ≈ 1, nearly orthogonal.
fn gaussian_rows(rows: usize, d: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let scale = (d as f32).sqrt().recip();
    (0..rows * d)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * scale)
        .collect()
}

/// Scales `x` to unit L2 norm (the norm accumulated in f64). A zero vector, which needs all
/// three weights at 0 and is rejected by `validate`, is left as is.
fn normalise(x: &mut [f32]) {
    let norm = x
        .iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for v in x.iter_mut() {
            *v = (*v as f64 / norm) as f32;
        }
    }
}

/// Sizes of the fine classes, each in `min..=max`, summing to `num_items`.
///
/// Each size is `min + e` with `e` drawn from a geometric law truncated to `0..=max − min`, its
/// ratio chosen so the mean size is `N / F`: many small classes and a tail up to the maximum, as
/// in SOP. Random ±1 steps on classes with room then make the sum exact.
fn fine_class_sizes(spec: &SyntheticSpec, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let (f, lo, hi) = (
        spec.num_fine_classes,
        spec.min_class_size,
        spec.max_class_size,
    );
    let span = hi - lo;
    let mean_excess = spec.num_items as f64 / f as f64 - lo as f64;
    let q = truncated_geometric_ratio(mean_excess, span);
    let cumulative: Vec<f64> = (0..=span)
        .scan(0.0, |acc, e| {
            *acc += q.powi(e as i32);
            Some(*acc)
        })
        .collect();
    let total = cumulative[span];
    let mut sizes: Vec<usize> = (0..f)
        .map(|_| {
            let u = rng.random::<f64>() * total;
            lo + cumulative.partition_point(|&c| c <= u).min(span)
        })
        .collect();
    let mut missing = spec.num_items as i64 - sizes.iter().sum::<usize>() as i64;
    while missing != 0 {
        let c = rng.random_range(0..f);
        if missing > 0 && sizes[c] < hi {
            sizes[c] += 1;
            missing -= 1;
        } else if missing < 0 && sizes[c] > lo {
            sizes[c] -= 1;
            missing += 1;
        }
    }
    sizes
}

/// The ratio `q` of the law `P(e) ∝ q^e` on `0..=span` whose mean is `mean` (bisection on
/// `ln q`; the mean increases with `q`, from 0 to `span`).
fn truncated_geometric_ratio(mean: f64, span: usize) -> f64 {
    let mean_of = |q: f64| {
        let (mut num, mut den) = (0.0, 0.0);
        for e in 0..=span {
            let w = q.powi(e as i32);
            num += e as f64 * w;
            den += w;
        }
        num / den
    };
    let (mut lo, mut hi) = (-30.0f64, 30.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mean_of(mid.exp()) < mean {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (0.5 * (lo + hi)).exp()
}

/// The coarse class of each fine class: every coarse class gets one fine class, the others are
/// spread with Gamma-distributed weights (unequal categories), and fine ids are numbered coarse
/// class by coarse class, as in SOP.
fn coarse_class_of_fine(spec: &SyntheticSpec, rng: &mut ChaCha8Rng) -> Result<Vec<usize>> {
    let k = spec.num_coarse_classes;
    let gamma = Gamma::new(COARSE_SIZE_SHAPE, 1.0)
        .map_err(|e| Error::invalid("coarse class sizes", e.to_string()))?;
    let weights: Vec<f64> = (0..k).map(|_| gamma.sample(rng)).collect();
    let cumulative: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w;
            Some(*acc)
        })
        .collect();
    let total = cumulative[k - 1];
    let mut counts = vec![1usize; k];
    for _ in k..spec.num_fine_classes {
        let u = rng.random::<f64>() * total;
        counts[cumulative.partition_point(|&c| c <= u).min(k - 1)] += 1;
    }
    Ok(counts
        .iter()
        .enumerate()
        .flat_map(|(coarse, &n)| std::iter::repeat_n(coarse, n))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// R@1 by brute force over all pairs, for the fine level and the coarse level (the share of
    /// queries whose nearest other item shares their fine / coarse class).
    fn recall_at_1(set: &SyntheticSet) -> (f64, f64) {
        let x = set.embeddings.to_vec2::<f32>().unwrap();
        let n = x.len();
        let (mut fine, mut coarse) = (0usize, 0usize);
        for i in 0..n {
            let best = (0..n)
                .filter(|&j| j != i)
                .map(|j| {
                    let s: f32 = x[i].iter().zip(&x[j]).map(|(a, b)| a * b).sum();
                    (s, j)
                })
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap()
                .1;
            fine += (set.labels.level(i, best) == 2) as usize;
            coarse += (set.labels.level(i, best) >= 1) as usize;
        }
        (fine as f64 / n as f64, coarse as f64 / n as f64)
    }

    #[test]
    fn small_preset_has_sop_shape() {
        let spec = SyntheticSpec::small();
        let set = spec.generate().unwrap();
        assert_eq!(set.embeddings.dims2().unwrap(), (600, 64));
        let y = &set.labels;
        assert_eq!(y.num_levels(), 2);
        let mut sizes = std::collections::BTreeMap::<i64, usize>::new();
        for c in y.column(0) {
            *sizes.entry(c).or_default() += 1;
        }
        assert_eq!(sizes.len(), 112);
        assert!(sizes.values().all(|&s| (2..=12).contains(&s)), "{sizes:?}");
        let coarse: std::collections::BTreeSet<i64> = y.column(1).into_iter().collect();
        assert_eq!(coarse.len(), 12);
        // Rows are unit vectors.
        for row in set.embeddings.to_vec2::<f32>().unwrap() {
            let norm: f32 = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        }
    }

    #[test]
    fn recall_is_informative_and_coarse_structure_matters() {
        let set = SyntheticSpec::small().generate().unwrap();
        let (fine, coarse) = recall_at_1(&set);
        // Neither trivial nor hopeless, like a trained model on SOP (R@1 ≈ 0.8 there).
        assert!((0.5..0.92).contains(&fine), "fine R@1 = {fine}");
        // Most first-rank mistakes stay in the coarse class; by chance (12 unequal coarse
        // classes) the nearest item would share it about 1 time in 10.
        assert!(
            coarse > fine + 0.5 * (1.0 - fine),
            "fine {fine}, coarse {coarse}"
        );
    }

    #[test]
    fn deterministic_from_the_seed() {
        let a = SyntheticSpec::small().generate().unwrap();
        let b = SyntheticSpec::small().generate().unwrap();
        let c = SyntheticSpec::small().with_seed(1).generate().unwrap();
        let va = a.embeddings.to_vec2::<f32>().unwrap();
        assert_eq!(va, b.embeddings.to_vec2::<f32>().unwrap());
        assert_eq!(a.labels, b.labels);
        assert_ne!(va, c.embeddings.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn sop_class_structure() {
        // The structure only (sizes and coarse groups), without the 31M-value embeddings.
        let spec = SyntheticSpec::sop();
        let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
        let sizes = fine_class_sizes(&spec, &mut rng);
        assert_eq!(sizes.len(), 11_316);
        assert_eq!(sizes.iter().sum::<usize>(), 60_502);
        assert!(sizes.iter().all(|s| (2..=12).contains(s)));
        // Skewed towards small classes, with a tail up to the maximum.
        let small = sizes.iter().filter(|&&s| s <= 4).count();
        assert!(small > sizes.len() / 3, "{small}");
        assert!(sizes.contains(&12));
        let coarse = coarse_class_of_fine(&spec, &mut rng).unwrap();
        assert_eq!(coarse.len(), 11_316);
        assert!(coarse.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*coarse.last().unwrap(), 11);
    }

    #[test]
    fn geometric_ratio_matches_the_mean() {
        for (mean, span) in [(3.3466, 10), (5.0, 10), (8.0, 10), (0.5, 3)] {
            let q = truncated_geometric_ratio(mean, span);
            let w: Vec<f64> = (0..=span).map(|e| q.powi(e as i32)).collect();
            let m = w.iter().enumerate().map(|(e, w)| e as f64 * w).sum::<f64>()
                / w.iter().sum::<f64>();
            assert!((m - mean).abs() < 1e-9, "{mean}: {m}");
        }
        assert!((truncated_geometric_ratio(5.0, 10) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = SyntheticSpec {
            num_items: 10,
            ..SyntheticSpec::small()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("num_items"));
        let bad = SyntheticSpec {
            num_coarse_classes: 200,
            ..SyntheticSpec::small()
        };
        assert!(bad
            .generate()
            .unwrap_err()
            .to_string()
            .contains("num_coarse_classes"));
        let bad = SyntheticSpec {
            noise: f32::NAN,
            ..SyntheticSpec::small()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("noise"));
        assert_eq!("SOP".parse::<Preset>().unwrap(), Preset::Sop);
        assert!("big".parse::<Preset>().is_err());
    }
}

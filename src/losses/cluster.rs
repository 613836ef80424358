//! HAPPIER's clustering loss `L_clust` (Eq. 6): a normalised softmax over learnable,
//! L2-normalised proxies, one per fine training class,
//!
//! ```text
//! L_clust = − log( exp(v_y·p_y / σ) / Σ_z exp(v_y·p_z / σ) ),   σ = 0.05,
//! ```
//!
//! averaged over the batch (the authors' `ClusterLoss`, adapted from NormSoftmax, with
//! `nn.CrossEntropyLoss`). The paper does not give σ; 0.05 is the code's value. Proxies are
//! initialised `U(−1/√d, 1/√d)` as `nn.Linear` weights.

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::losses::smooth_rank::l2_normalize;
use crate::losses::{check_batch, RankLoss};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Uniform};
use std::collections::HashMap;

/// The clustering loss over fine-class proxies (HAPPIER Eq. 6).
#[derive(Debug, Clone)]
pub struct ClusterLoss {
    proxies: Var,
    classes: Vec<ClassId>,
    index: HashMap<ClassId, usize>,
    /// Temperature σ (0.05).
    pub temperature: f64,
    /// L2-normalise the embeddings (the model's output is normalised in HAPPIER, so this is a
    /// no-op there).
    pub normalize: bool,
}

impl ClusterLoss {
    /// One proxy per class of `classes` (the fine training classes), dimension `dim`,
    /// initialised `U(−1/√dim, 1/√dim)` from a ChaCha8 generator seeded with `seed`.
    pub fn new(
        classes: &[ClassId],
        dim: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(Error::invalid("dim", "must be at least 1"));
        }
        let bound = 1.0 / (dim as f64).sqrt();
        let uniform = Uniform::new(-bound, bound)
            .map_err(|e| Error::invalid("dim", format!("cannot draw proxies: {e}")))?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let values: Vec<f64> = (0..classes.len() * dim)
            .map(|_| uniform.sample(&mut rng))
            .collect();
        let init = Tensor::from_vec(values, (classes.len(), dim), device)?.to_dtype(dtype)?;
        Self::with_proxies(classes, Var::from_tensor(&init)?)
    }

    /// Uses `proxies` (`C × D`, row `i` for `classes[i]`), e.g. restored from a checkpoint.
    pub fn with_proxies(classes: &[ClassId], proxies: Var) -> Result<Self> {
        let (c, _) = proxies.dims2()?;
        if c != classes.len() || c == 0 {
            return Err(Error::Shape(format!(
                "{c} proxies for {} classes (need one per class, at least one)",
                classes.len()
            )));
        }
        let mut index = HashMap::with_capacity(c);
        for (i, &cl) in classes.iter().enumerate() {
            if index.insert(cl, i).is_some() {
                return Err(Error::invalid(
                    "classes",
                    format!("class {cl} is listed twice"),
                ));
            }
        }
        Ok(ClusterLoss {
            proxies,
            classes: classes.to_vec(),
            index,
            temperature: 0.05,
            normalize: true,
        })
    }

    /// The learnable proxies (`C × D`), to hand to an optimizer.
    pub fn proxies(&self) -> &Var {
        &self.proxies
    }

    /// The class of each proxy row.
    pub fn classes(&self) -> &[ClassId] {
        &self.classes
    }

    /// Proxy index of each item's fine class; errors on a class without a proxy.
    fn targets(&self, labels: &Labels) -> Result<Vec<u32>> {
        (0..labels.len())
            .map(|i| {
                let c = labels.fine(i);
                self.index.get(&c).map(|&k| k as u32).ok_or_else(|| {
                    Error::Labels(format!(
                        "row {i}: fine class {c} has no proxy (the clustering loss was built \
                         for {} classes)",
                        self.classes.len()
                    ))
                })
            })
            .collect()
    }
}

impl RankLoss for ClusterLoss {
    /// The proxies, named `proxies`.
    fn trainable_vars(&self) -> Vec<(String, candle_core::Var)> {
        vec![("proxies".into(), self.proxies.clone())]
    }

    /// Mean cross-entropy of `v · normalize(P)ᵀ / σ` against the fine class.
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> Result<Tensor> {
        check_batch(embeddings, labels)?;
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(Error::invalid(
                "temperature",
                format!("must be finite and > 0, got {}", self.temperature),
            ));
        }
        let (_, d) = embeddings.dims2()?;
        let (_, pd) = self.proxies.dims2()?;
        if d != pd {
            return Err(Error::Shape(format!(
                "embeddings have dimension {d} but the proxies {pd}"
            )));
        }
        let v = if self.normalize {
            l2_normalize(embeddings, "embeddings")?
        } else {
            embeddings.clone()
        };
        let p = l2_normalize(self.proxies.as_tensor(), "proxies")?.to_dtype(v.dtype())?;
        let logits = (v.matmul(&p.t()?)? / self.temperature)?;
        let targets = Tensor::new(self.targets(labels)?, embeddings.device())?;
        Ok(candle_nn::loss::cross_entropy(&logits, &targets)?)
    }
}

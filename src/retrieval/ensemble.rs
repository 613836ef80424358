//! Several embedding models evaluated as one: the concatenated embedding of Musgrave et al.
//!
//! *A Metric Learning Reality Check* (ECCV 2020) trains one model per fold of a class-disjoint
//! cross-validation and reports two test results: **separated**, the mean of the fold models'
//! metrics (each model alone), and **concatenated**, the metrics of one embedding per test image
//! made by concatenating the fold models' embeddings of it (four 128-d models → 512-d).
//!
//! Each model's embedding is L2-normalised before the concatenation. Why: every model then
//! weighs the same, whatever the scale of its output, and the cosine similarity of two
//! concatenations is the mean of the models' cosine similarities,
//! `cos([a₁ … a_K], [b₁ … b_K]) = (1/K) Σ_k cos(a_k, b_k)` for unit `a_k`, `b_k`: the ensemble
//! ranks by the average of its members' similarities (tested against that formulation).

use super::{check_matrix_shape, evaluate, normalise_rows, EvalOptions, EvalReport, SelfMatch};
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use candle_core::{DType, Device, Tensor};

/// A test set as one model embedded it: its queries and, for a protocol with a separate
/// gallery (In-Shop, DyML), its gallery; without one, the queries are ranked against each
/// other (SOP, CUB, Cars, the embedded dataset).
#[derive(Debug, Clone)]
pub struct TestEmbeddings {
    /// `N_q × D` query embeddings.
    pub queries: Tensor,
    /// The queries' labels.
    pub query_labels: Labels,
    /// `N_g × D` gallery embeddings and their labels, if the set has a separate gallery.
    pub gallery: Option<(Tensor, Labels)>,
}

impl TestEmbeddings {
    /// The retrieval metrics of this set, as the trainer measures a test set: each query
    /// against the others without a gallery (`opts.self_match` as given, normally
    /// [`SelfMatch::SameIndex`]), against the gallery with one ([`SelfMatch::None`]).
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use rankwise::hierarchy::Labels;
    /// use rankwise::retrieval::{ensemble::TestEmbeddings, EvalOptions};
    /// // Two classes of two images each: every nearest neighbour is of the query's class.
    /// let x = Tensor::new(&[[1f32, 0.1], [1.0, -0.1], [0.1, 1.0], [-0.1, 1.0]], &Device::Cpu)?;
    /// let set = TestEmbeddings { queries: x, query_labels: Labels::from_fine(&[0, 0, 1, 1])?,
    ///                            gallery: None };
    /// let report = set.evaluate(&EvalOptions { recall_ks: vec![1], ..EvalOptions::default() })?;
    /// assert_eq!(report.get("R@1", Some(0)), Some(1.0));
    /// # Ok::<(), rankwise::Error>(())
    /// ```
    pub fn evaluate(&self, opts: &EvalOptions) -> Result<EvalReport> {
        match &self.gallery {
            None => evaluate(&self.queries, &self.query_labels, None, opts),
            Some((gallery, labels)) => {
                let opts = EvalOptions {
                    self_match: SelfMatch::None,
                    ..opts.clone()
                };
                evaluate(
                    &self.queries,
                    &self.query_labels,
                    Some((gallery, labels)),
                    &opts,
                )
            }
        }
    }
}

/// The concatenated embedding of `models` (Musgrave et al.'s ensemble, see the module
/// documentation): each model's embeddings L2-normalised, then concatenated image by image
/// (`N × Σ D_k`, in `f32` on the CPU). The models must have embedded the same test set: the
/// same query labels, and the same gallery labels or none; an error names the first model that
/// differs.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::hierarchy::Labels;
/// use rankwise::retrieval::ensemble::{concatenate, TestEmbeddings};
/// let labels = Labels::from_fine(&[0, 1])?;
/// let model = |rows: [[f32; 2]; 2]| -> rankwise::Result<TestEmbeddings> {
///     Ok(TestEmbeddings { queries: Tensor::new(&rows, &Device::Cpu)?,
///                         query_labels: labels.clone(), gallery: None })
/// };
/// // Each model's rows are normalised first: [3, 4] counts as [0.6, 0.8].
/// let both = concatenate(&[model([[3.0, 4.0], [0.0, 2.0]])?, model([[1.0, 0.0], [0.0, 1.0]])?])?;
/// assert_eq!(both.queries.to_vec2::<f32>()?, [[0.6, 0.8, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]);
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn concatenate(models: &[TestEmbeddings]) -> Result<TestEmbeddings> {
    let first = models
        .first()
        .ok_or_else(|| Error::invalid("ensemble", "no model to concatenate"))?;
    for (k, m) in models.iter().enumerate().skip(1) {
        if m.query_labels != first.query_labels {
            return Err(Error::invalid(
                "ensemble",
                format!("model {k} embedded other queries than model 0 (their labels differ)"),
            ));
        }
        let same_gallery = match (&m.gallery, &first.gallery) {
            (None, None) => true,
            (Some((_, a)), Some((_, b))) => a == b,
            _ => false,
        };
        if !same_gallery {
            return Err(Error::invalid(
                "ensemble",
                format!("model {k} embedded another gallery than model 0"),
            ));
        }
    }
    // A model's queries and gallery must share its width: otherwise the concatenations could
    // still agree in total width (4 + 2 against 2 + 4) and the ensemble would silently score
    // one model's coordinates against another's.
    for (k, m) in models.iter().enumerate() {
        if let Some((gallery, _)) = &m.gallery {
            let (dq, dg) = (m.queries.dims().get(1), gallery.dims().get(1));
            if dq != dg {
                return Err(Error::Shape(format!(
                    "model {k}'s query embeddings have {} dimensions but its gallery embeddings \
                     have {}",
                    dq.map_or("no".into(), ToString::to_string),
                    dg.map_or("no".into(), ToString::to_string)
                )));
            }
        }
    }
    let queries = joined(models.iter().map(|m| &m.queries), "query")?;
    let gallery = match &first.gallery {
        None => None,
        Some((_, labels)) => {
            let parts = models
                .iter()
                .map(|m| &m.gallery.as_ref().expect("checked above").0);
            Some((joined(parts, "gallery")?, labels.clone()))
        }
    };
    Ok(TestEmbeddings {
        queries,
        query_labels: first.query_labels.clone(),
        gallery,
    })
}

/// The `N × D_k` embeddings of each model, rows L2-normalised, side by side.
fn joined<'a>(parts: impl Iterator<Item = &'a Tensor>, what: &str) -> Result<Tensor> {
    let normalised = parts
        .enumerate()
        .map(|(k, x)| {
            check_matrix_shape(x, &format!("model {k}'s {what} embeddings"))?;
            normalise_rows(&x.to_device(&Device::Cpu)?.to_dtype(DType::F32)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = normalised[0].dim(0)?;
    if let Some(k) = normalised.iter().position(|x| x.dims()[0] != rows) {
        return Err(Error::Shape(format!(
            "model {k} has {} {what} embeddings, model 0 has {rows}",
            normalised[k].dims()[0]
        )));
    }
    Ok(Tensor::cat(&normalised, 1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, d: usize, seed: u64) -> Tensor {
        // A small LCG: fixed values, no dependency on the RNG crate's stream.
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n * d)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(v, (n, d), &Device::Cpu).unwrap()
    }

    fn set(x: Tensor, labels: &Labels) -> TestEmbeddings {
        TestEmbeddings {
            queries: x,
            query_labels: labels.clone(),
            gallery: None,
        }
    }

    fn opts() -> EvalOptions {
        EvalOptions {
            recall_ks: vec![1, 2],
            ..EvalOptions::default()
        }
    }

    #[test]
    fn the_concatenation_ranks_by_the_mean_of_the_models_cosine_similarities() {
        let n = 40;
        let fine: Vec<i64> = (0..n as i64).map(|i| i % 7).collect();
        let labels = Labels::from_fine(&fine).unwrap();
        // Three models of different widths and scales.
        let models: Vec<TestEmbeddings> = [(8, 1.0), (5, 30.0), (12, 0.01)]
            .iter()
            .enumerate()
            .map(|(k, &(d, scale))| set((random(n, d, k as u64) * scale).unwrap(), &labels))
            .collect();
        let report = concatenate(&models).unwrap().evaluate(&opts()).unwrap();
        // The plain formulation: for each query, the reference of the highest mean cosine
        // similarity over the models (itself excluded; ties to the lower index), then R@1.
        let unit: Vec<Vec<Vec<f64>>> = models
            .iter()
            .map(|m| {
                m.queries
                    .to_vec2::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(|r| {
                        let r: Vec<f64> = r.into_iter().map(f64::from).collect();
                        let norm = r.iter().map(|v| v * v).sum::<f64>().sqrt();
                        r.into_iter().map(|v| v / norm).collect()
                    })
                    .collect()
            })
            .collect();
        let mut hits = 0;
        for q in 0..n {
            let mut best = (f64::NEG_INFINITY, 0);
            for r in (0..n).filter(|&r| r != q) {
                let s: f64 = unit
                    .iter()
                    .map(|m| m[q].iter().zip(&m[r]).map(|(a, b)| a * b).sum::<f64>())
                    .sum::<f64>()
                    / unit.len() as f64;
                if s > best.0 {
                    best = (s, r);
                }
            }
            hits += usize::from(fine[best.1] == fine[q]);
        }
        let r1 = report.get("R@1", Some(0)).unwrap();
        assert!(
            (r1 - hits as f64 / n as f64).abs() < 1e-12,
            "{r1} vs {hits}/{n}"
        );
        // Side by side: N × (8 + 5 + 12).
        assert_eq!(
            concatenate(&models).unwrap().queries.dims(),
            [n, 8 + 5 + 12]
        );
    }

    #[test]
    fn a_model_concatenated_with_itself_ranks_as_the_model() {
        let labels = Labels::from_fine(&(0..30).map(|i| i % 5).collect::<Vec<i64>>()).unwrap();
        let one = set(random(30, 6, 9), &labels);
        let alone = one.evaluate(&opts()).unwrap();
        let twice = concatenate(&[one.clone(), one])
            .unwrap()
            .evaluate(&opts())
            .unwrap();
        // The same ranking, so the same metrics and counts.
        assert_eq!(alone.rows, twice.rows);
    }

    #[test]
    fn a_gallery_is_concatenated_and_ranked_against_without_self_match() {
        let ql = Labels::from_fine(&[0, 1, 2]).unwrap();
        let gl = Labels::from_fine(&[0, 1, 2, 0]).unwrap();
        let model = |seed| TestEmbeddings {
            queries: random(3, 4, seed),
            query_labels: ql.clone(),
            gallery: Some((random(4, 4, seed + 100), gl.clone())),
        };
        let both = concatenate(&[model(1), model(2)]).unwrap();
        let (g, labels) = both.gallery.as_ref().unwrap();
        assert_eq!((g.dims(), labels), ([4, 8].as_slice(), &gl));
        let report = both.evaluate(&opts()).unwrap();
        assert_eq!((report.num_queries, report.num_references), (3, 4));
        // Widths swapped between the queries and the gallery of each model: the totals agree
        // (4 + 2 both ways), the pairing of coordinates would not.
        let skewed = |qd, gd| TestEmbeddings {
            queries: random(3, qd, 5),
            query_labels: ql.clone(),
            gallery: Some((random(4, gd, 6), gl.clone())),
        };
        let e = concatenate(&[skewed(4, 2), skewed(2, 4)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "model 0's query embeddings have 4 dimensions but its gallery embeddings have 2"
            ),
            "{e}"
        );
    }

    #[test]
    fn models_of_other_test_sets_are_refused_naming_the_model() {
        let a = Labels::from_fine(&[0, 0, 1, 1]).unwrap();
        let b = Labels::from_fine(&[0, 1, 0, 1]).unwrap();
        let e = concatenate(&[set(random(4, 3, 0), &a), set(random(4, 3, 1), &b)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("model 1") && e.contains("other queries"), "{e}");
        let with_gallery = TestEmbeddings {
            gallery: Some((random(4, 3, 2), a.clone())),
            ..set(random(4, 3, 3), &a)
        };
        let e = concatenate(&[set(random(4, 3, 0), &a), with_gallery])
            .unwrap_err()
            .to_string();
        assert!(e.contains("model 1") && e.contains("gallery"), "{e}");
        let e = concatenate(&[set(random(4, 3, 0), &a), set(random(3, 3, 1), &a)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("model 1 has 3 query embeddings"), "{e}");
        assert!(concatenate(&[]).is_err());
    }
}

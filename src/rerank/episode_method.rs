//! A few-shot classifier named by a short string, as `rankwise fewshot --classifier` takes it:
//! the rows of SSR Table 2 on frozen features, each scored on the same episodes and compared
//! with the first episode by episode.
//!
//! | string | classifier |
//! |---|---|
//! | `prototype` | nearest prototype by cosine: Table 2's "Baseline" ([`PrototypeClassifier`]) |
//! | `protonet` | nearest prototype by squared Euclidean distance (ProtoNet's rule) |
//! | `soft-kmeans` or `soft-kmeans:STEPS,SCALE` | prototypes refined by soft k-means over the queries ([`SoftKMeansClassifier`]; default `1,10`) |
//! | `k-reciprocal` or `k-reciprocal:K1,K2,LAMBDA` | "+ k-reciprocal" ([`KReciprocalClassifier`]; default `20,6,0.3`) |
//! | `k-reciprocal:grid` | "+ k-reciprocal" as SSR's script reports it: the best of its 27-point grid ([`ssr_fewshot_grid`]) **on the test episodes themselves**, optimistic |
//! | `ssr:PATH` | SSR, "+ Ours" ([`SsrClassifier`]), with a model written by [`SsrModel::save`] |
//!
//! [`EpisodeMethod`]'s `Display` writes the same form with every parameter, so a results file
//! names the classifier exactly and the string parses back to it.
//!
//! [`compare_methods`] scores every classifier on the same episodes (one [`EpisodeSampler`]
//! stream: episode `e` is the same support and queries for all) and compares each with the
//! first, episode by episode: the paired t-test over the episodes removes each episode's own
//! difficulty — which moves a single accuracy by far more than the classifiers differ — from
//! the noise, as the claims' tests do over SSR's shared episodes ([`crate::stats::paired_t`]).
//! It covers the choice of episodes, not the training of the features or of an SSR model.
//!
//! [`EpisodeSampler`]: crate::samplers::episodes::EpisodeSampler

use super::k_reciprocal::classifier::{ssr_fewshot_grid, KReciprocalClassifier};
use super::k_reciprocal::KReciprocal;
use super::method::param;
use super::ssr::{SsrClassifier, SsrModel, SupportNodes, Task};
use super::RerankMethod;
use crate::error::{Error, Result};
use crate::fewshot::prototype::{PrototypeClassifier, PrototypeMetric};
use crate::fewshot::soft_kmeans::SoftKMeansClassifier;
use crate::fewshot::{argmax, episode_accuracies};
use crate::hierarchy::Labels;
use crate::metrics::fewshot::{accuracy_interval, AccuracyInterval};
use crate::samplers::episodes::EpisodeConfig;
use crate::stats::{paired_t, PairedT};
use candle_core::Tensor;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

/// A few-shot classifier (see the module documentation).
#[derive(Debug, Clone)]
pub enum EpisodeMethod {
    /// The nearest class prototype, by cosine (`prototype`) or squared Euclidean distance
    /// (`protonet`).
    Prototype(PrototypeMetric),
    /// Soft k-means refinement of the prototypes.
    SoftKMeans(SoftKMeansClassifier),
    /// k-reciprocal re-ranking of the queries against the prototypes.
    KReciprocal(KReciprocal),
    /// The best point of SSR's k-reciprocal grid, chosen on the episodes it is scored on.
    KReciprocalGrid,
    /// SSR with a saved model.
    Ssr {
        /// The model's file, as given.
        path: PathBuf,
        /// The model, loaded.
        model: Arc<SsrModel>,
    },
}

/// The forms [`EpisodeMethod::from_str`] accepts, for its errors.
const FORMS: &str = "prototype, protonet, soft-kmeans[:STEPS,SCALE], \
                     k-reciprocal[:K1,K2,LAMBDA], k-reciprocal:grid or ssr:PATH";

/// One classifier's accuracy on each episode.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodAccuracies {
    /// The classifier, as [`EpisodeMethod`]'s `Display` writes it.
    pub method: String,
    /// For `k-reciprocal:grid`, the grid point chosen (`k-reciprocal:K1,K2,LAMBDA`).
    pub chosen: Option<String>,
    /// Accuracy (percent) on episodes `0..n`, in order.
    pub accuracies: Vec<f64>,
}

/// One classifier's result in a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodResult {
    /// The classifier, its grid point if any, and its accuracy on each episode: what another
    /// tool or another features file scored on the same episodes (same labels, configuration
    /// and seed) pairs with.
    pub run: MethodAccuracies,
    /// Mean accuracy (percent) ± the few-shot literature's 95% half-width.
    pub accuracy: AccuracyInterval,
    /// This classifier's accuracy minus the first one's, episode by episode (`None` for the
    /// first).
    pub versus_first: Option<PairedT>,
}

impl EpisodeMethod {
    /// Accuracy (percent) on each of episodes `0..n_episodes` of an episode sampler over
    /// `labels` with `config` and `seed` ([`episode_accuracies`]). For an SSR model, errors
    /// (naming its file) unless it was meta-trained for these episodes' support nodes and
    /// queries.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use rankwise::rerank::EpisodeMethod;
    /// use rankwise::samplers::episodes::EpisodeConfig;
    /// use rankwise::Labels;
    ///
    /// // Two classes of three items, on two axes: every 2-way 1-shot episode is solved.
    /// let x = Tensor::new(
    ///     &[[1.0f32, 0.0], [0.9, 0.1], [1.0, 0.2], [0.0, 1.0], [0.1, 0.9], [0.2, 1.0]],
    ///     &Device::Cpu,
    /// )?;
    /// let labels = Labels::from_fine(&[0, 0, 0, 1, 1, 1])?;
    /// let config = EpisodeConfig { ways: 2, shots: 1, queries: 2, ..EpisodeConfig::default() };
    /// let method: EpisodeMethod = "prototype".parse()?;
    /// let acc = method.episode_accuracies(&x, &labels, &config, 10, 0)?;
    /// assert_eq!(acc.accuracies, vec![100.0; 10]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn episode_accuracies(
        &self,
        features: &Tensor,
        labels: &Labels,
        config: &EpisodeConfig,
        n_episodes: usize,
        seed: u64,
    ) -> Result<MethodAccuracies> {
        let run = |c: &(dyn crate::fewshot::EpisodeClassifier + Sync)| {
            episode_accuracies(c, features, labels, config, n_episodes, seed)
        };
        let (accuracies, chosen) = match self {
            EpisodeMethod::Prototype(metric) => {
                (run(&PrototypeClassifier { metric: *metric })?, None)
            }
            EpisodeMethod::SoftKMeans(c) => (run(c)?, None),
            EpisodeMethod::KReciprocal(params) => {
                (run(&KReciprocalClassifier { params: *params })?, None)
            }
            EpisodeMethod::KReciprocalGrid => {
                // SSR's protocol: every grid point on these episodes, the best mean kept (the
                // mean reported, as `best_of_grid` compares them; ties to the first point).
                let mut points = Vec::new();
                for params in ssr_fewshot_grid() {
                    points.push((params, run(&KReciprocalClassifier { params })?));
                }
                let means = points
                    .iter()
                    .map(|(_, a)| Ok(accuracy_interval(a)?.mean))
                    .collect::<Result<Vec<f64>>>()?;
                let (params, acc) = points.swap_remove(argmax(&means));
                (acc, Some(RerankMethod::KReciprocal(params).to_string()))
            }
            EpisodeMethod::Ssr { path, model } => {
                let support_nodes = ssr_support_nodes(model, config)
                    .map_err(|e| Error::file(path, format!("{e}")))?;
                let classifier = SsrClassifier {
                    model,
                    support_nodes,
                };
                (run(&classifier)?, None)
            }
        };
        Ok(MethodAccuracies {
            method: self.to_string(),
            chosen,
            accuracies,
        })
    }
}

/// The support nodes an SSR model was meta-trained on, from its graph's size: one per class
/// (prototypes, the authors' code) or one per shot (the paper); an error naming both shapes when
/// the model's graph is not this episode's.
fn ssr_support_nodes(model: &SsrModel, config: &EpisodeConfig) -> Result<SupportNodes> {
    let (ways, shots, queries) = (config.ways, config.shots, config.ways * config.queries);
    let Task::FewShot {
        supports,
        queries: model_queries,
    } = model.task
    else {
        return Err(Error::invalid(
            "classifier",
            "the SSR model was meta-trained for retrieval, not for few-shot episodes",
        ));
    };
    let nodes = if supports == ways {
        Some(SupportNodes::Prototypes)
    } else if supports == ways * shots {
        Some(SupportNodes::Shots)
    } else {
        None
    };
    match nodes {
        Some(nodes) if model_queries == queries => Ok(nodes),
        _ => Err(Error::invalid(
            "classifier",
            format!(
                "the SSR model was meta-trained on graphs of {supports} support nodes and \
                 {model_queries} queries; {ways}-way {shots}-shot episodes with {} queries per \
                 class have {ways} prototypes (or {} shots) and {queries} queries",
                config.queries,
                ways * shots
            ),
        )),
    }
}

/// Every classifier of `methods` on the same episodes `0..n_episodes` (an episode sampler over
/// `labels` with `config` and `seed`), each compared with the first episode by episode (see the
/// module documentation). Errors on an empty list and as
/// [`EpisodeMethod::episode_accuracies`].
///
/// ```
/// use candle_core::{Device, Tensor};
/// use rankwise::rerank::episode_method::compare_methods;
/// use rankwise::rerank::EpisodeMethod;
/// use rankwise::samplers::episodes::EpisodeConfig;
/// use rankwise::Labels;
///
/// let x = Tensor::new(
///     &[[1.0f32, 0.0], [0.9, 0.1], [1.0, 0.2], [0.0, 1.0], [0.1, 0.9], [0.2, 1.0]],
///     &Device::Cpu,
/// )?;
/// let labels = Labels::from_fine(&[0, 0, 0, 1, 1, 1])?;
/// let config = EpisodeConfig { ways: 2, shots: 1, queries: 2, ..EpisodeConfig::default() };
/// let methods: Vec<EpisodeMethod> =
///     vec!["prototype".parse()?, "soft-kmeans:1,10".parse()?];
/// let rows = compare_methods(&methods, &x, &labels, &config, 20, 0)?;
/// assert_eq!(rows[0].accuracy.mean, 100.0);
/// assert!(rows[0].versus_first.is_none());
/// // Both solve every episode: no difference, p = 1.
/// let d = rows[1].versus_first.unwrap();
/// assert_eq!((d.mean, d.p, d.n), (0.0, 1.0, 20));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn compare_methods(
    methods: &[EpisodeMethod],
    features: &Tensor,
    labels: &Labels,
    config: &EpisodeConfig,
    n_episodes: usize,
    seed: u64,
) -> Result<Vec<MethodResult>> {
    if methods.is_empty() {
        return Err(Error::invalid("classifier", "name at least one"));
    }
    let runs = methods
        .iter()
        .map(|m| m.episode_accuracies(features, labels, config, n_episodes, seed))
        .collect::<Result<Vec<_>>>()?;
    let first = runs[0].accuracies.clone();
    runs.into_iter()
        .enumerate()
        .map(|(i, run)| {
            let versus_first = (i > 0).then(|| {
                let d: Vec<f64> = run
                    .accuracies
                    .iter()
                    .zip(&first)
                    .map(|(a, b)| a - b)
                    .collect();
                paired_t(&d)
            });
            Ok(MethodResult {
                accuracy: accuracy_interval(&run.accuracies)?,
                versus_first,
                run,
            })
        })
        .collect()
}

impl FromStr for EpisodeMethod {
    type Err = Error;

    /// Parses one of the forms of the module documentation (`ssr:PATH` loads the model); errors
    /// name the form expected, or the model's file.
    fn from_str(s: &str) -> Result<Self> {
        let (name, rest) = match s.split_once(':') {
            Some((name, rest)) => (name.trim(), Some(rest)),
            None => (s.trim(), None),
        };
        let params: Vec<&str> = rest.map(|r| r.split(',').collect()).unwrap_or_default();
        let no_params = |form: &str| -> Result<()> {
            match rest {
                None => Ok(()),
                Some(_) => Err(Error::invalid(
                    "classifier",
                    format!("{s:?}: {form} takes no parameter"),
                )),
            }
        };
        Ok(match name {
            "prototype" => {
                no_params("prototype")?;
                EpisodeMethod::Prototype(PrototypeMetric::Cosine)
            }
            "protonet" => {
                no_params("protonet")?;
                EpisodeMethod::Prototype(PrototypeMetric::SquaredEuclidean)
            }
            "soft-kmeans" => {
                let c = match params.len() {
                    0 => SoftKMeansClassifier::default(),
                    2 => SoftKMeansClassifier {
                        steps: param("classifier", name, &params, 0, "STEPS")?,
                        scale: param("classifier", name, &params, 1, "SCALE")?,
                    },
                    n => {
                        return Err(Error::invalid(
                            "classifier",
                            format!(
                                "{s:?}: expected soft-kmeans or soft-kmeans:STEPS,SCALE ({n} \
                                 parameter(s) given)"
                            ),
                        ))
                    }
                };
                if !(c.scale.is_finite() && c.scale > 0.0) {
                    return Err(Error::invalid(
                        "classifier",
                        format!("{s:?}: SCALE must be finite and > 0, got {}", c.scale),
                    ));
                }
                EpisodeMethod::SoftKMeans(c)
            }
            "k-reciprocal" if rest.map(str::trim) == Some("grid") => EpisodeMethod::KReciprocalGrid,
            // The re-ranking method's own parser and checks, its errors under this flag's name.
            "k-reciprocal" => match RerankMethod::from_str(s) {
                Ok(RerankMethod::KReciprocal(k)) => EpisodeMethod::KReciprocal(k),
                Ok(other) => {
                    return Err(Error::invalid(
                        "classifier",
                        format!("{s:?} parsed as {other}, not a k-reciprocal classifier"),
                    ))
                }
                Err(e) => {
                    return Err(Error::invalid(
                        "classifier",
                        format!("{e} (or k-reciprocal:grid)"),
                    ))
                }
            },
            "ssr" => {
                let path = PathBuf::from(rest.map(str::trim).unwrap_or_default());
                if path.as_os_str().is_empty() {
                    return Err(Error::invalid(
                        "classifier",
                        format!("{s:?}: expected ssr:PATH, the model's .safetensors file"),
                    ));
                }
                let model = Arc::new(SsrModel::load(&path)?);
                EpisodeMethod::Ssr { path, model }
            }
            _ => {
                return Err(Error::invalid(
                    "classifier",
                    format!("unknown classifier {name:?}: expected {FORMS}"),
                ))
            }
        })
    }
}

impl fmt::Display for EpisodeMethod {
    /// The classifier in the form [`EpisodeMethod::from_str`] reads, every parameter written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpisodeMethod::Prototype(PrototypeMetric::Cosine) => write!(f, "prototype"),
            EpisodeMethod::Prototype(PrototypeMetric::SquaredEuclidean) => write!(f, "protonet"),
            EpisodeMethod::SoftKMeans(c) => write!(f, "soft-kmeans:{},{}", c.steps, c.scale),
            EpisodeMethod::KReciprocal(k) => RerankMethod::KReciprocal(*k).fmt(f),
            EpisodeMethod::KReciprocalGrid => write!(f, "k-reciprocal:grid"),
            EpisodeMethod::Ssr { path, .. } => write!(f, "ssr:{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rerank::ssr::SsrConfig;
    use candle_core::{DType, Device};

    /// `classes` classes of `per_class` items in `dim` dimensions: each class a direction plus
    /// noise of scale `noise` (a fixed pseudo-random sequence), so that accuracies fall between
    /// chance and 100%.
    fn clusters(classes: usize, per_class: usize, dim: usize, noise: f32) -> (Tensor, Labels) {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        };
        let mut x = Vec::with_capacity(classes * per_class * dim);
        let mut ids = Vec::new();
        for c in 0..classes {
            for _ in 0..per_class {
                for j in 0..dim {
                    let centre = if j == c % dim { 1.0 } else { 0.0 };
                    x.push(centre + noise * next());
                }
                ids.push(c as i64);
            }
        }
        (
            Tensor::from_vec(x, (classes * per_class, dim), &Device::Cpu).unwrap(),
            Labels::from_fine(&ids).unwrap(),
        )
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        for (text, printed) in [
            ("prototype", "prototype"),
            ("protonet", "protonet"),
            ("soft-kmeans", "soft-kmeans:1,10"),
            ("soft-kmeans:3, 2.5", "soft-kmeans:3,2.5"),
            ("k-reciprocal", "k-reciprocal:20,6,0.3"),
            ("k-reciprocal:10,5,0.2", "k-reciprocal:10,5,0.2"),
            ("k-reciprocal:grid", "k-reciprocal:grid"),
        ] {
            let m: EpisodeMethod = text.parse().unwrap();
            assert_eq!(m.to_string(), printed, "{text}");
            let again: EpisodeMethod = printed.parse().unwrap();
            assert_eq!(again.to_string(), printed);
        }
        for (bad, says) in [
            ("nearest", "unknown classifier"),
            ("prototype:1", "takes no parameter"),
            ("soft-kmeans:1", "soft-kmeans:STEPS,SCALE"),
            ("soft-kmeans:1,0", "SCALE must be finite and > 0"),
            ("soft-kmeans:x,1", "STEPS must be a number"),
            ("k-reciprocal:0,6,0.3", "K1 must be at least 1"),
            ("k-reciprocal:20,6,2", "LAMBDA must be in [0, 1]"),
            ("ssr:", "expected ssr:PATH"),
            (
                "ssr:/nonexistent/model.safetensors",
                "/nonexistent/model.safetensors",
            ),
        ] {
            let e = bad.parse::<EpisodeMethod>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn methods_share_their_episodes_and_the_grid_keeps_its_best_point() {
        let (x, labels) = clusters(8, 12, 8, 1.6);
        let config = EpisodeConfig {
            ways: 5,
            shots: 1,
            queries: 5,
            ..EpisodeConfig::default()
        };
        let n = 60;
        let parse = |s: &str| s.parse::<EpisodeMethod>().unwrap();
        let methods = [
            parse("prototype"),
            parse("protonet"),
            parse("soft-kmeans"),
            parse("k-reciprocal:10,5,0.2"),
            parse("prototype"),
        ];
        let rows = compare_methods(&methods, &x, &labels, &config, n, 7).unwrap();
        // Each row's interval is that of its classifier alone on the same episodes.
        for (m, row) in methods.iter().zip(&rows) {
            let alone = m.episode_accuracies(&x, &labels, &config, n, 7).unwrap();
            assert_eq!(row.accuracy, accuracy_interval(&alone.accuracies).unwrap());
            assert_eq!(row.run, alone);
            assert_eq!(row.run.method, m.to_string());
        }
        let base = &rows[0].accuracy;
        assert!(base.mean > 30.0 && base.mean < 100.0, "{base:?}");
        // The same classifier again: the same episodes, so no difference at all.
        let same = rows[4].versus_first.unwrap();
        assert_eq!((same.mean, same.p, same.n), (0.0, 1.0, n));
        // The paired difference is the difference of the means.
        for row in &rows[1..4] {
            let d = row.versus_first.unwrap();
            assert!((d.mean - (row.accuracy.mean - base.mean)).abs() < 1e-9);
            assert!(d.interval.0 <= d.mean && d.mean <= d.interval.1);
        }
        // Another seed draws other episodes.
        let other = compare_methods(&methods[..1], &x, &labels, &config, n, 8).unwrap();
        assert_ne!(other[0].accuracy, rows[0].accuracy);

        // The grid: its chosen point's accuracies, the best mean of the 27 points.
        let config = EpisodeConfig {
            queries: 6,
            ..config
        };
        let grid = parse("k-reciprocal:grid")
            .episode_accuracies(&x, &labels, &config, 20, 3)
            .unwrap();
        let chosen: EpisodeMethod = grid.chosen.as_deref().unwrap().parse().unwrap();
        let at_chosen = chosen
            .episode_accuracies(&x, &labels, &config, 20, 3)
            .unwrap();
        assert_eq!(grid.accuracies, at_chosen.accuracies);
        let mean = |a: &[f64]| accuracy_interval(a).unwrap().mean;
        for params in ssr_fewshot_grid() {
            let point = EpisodeMethod::KReciprocal(params)
                .episode_accuracies(&x, &labels, &config, 20, 3)
                .unwrap();
            assert!(mean(&point.accuracies) <= mean(&grid.accuracies));
        }
        assert!(compare_methods(&[], &x, &labels, &config, 20, 3).is_err());
    }

    #[test]
    fn an_ssr_model_runs_on_the_episodes_it_was_trained_for() {
        let (x, labels) = clusters(6, 10, 6, 1.0);
        let config = EpisodeConfig {
            ways: 3,
            shots: 2,
            queries: 4,
            ..EpisodeConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let save = |name: &str, supports: usize, queries: usize| {
            let model = SsrModel::new(
                SsrConfig {
                    hidden: 8,
                    steps: 1,
                    ..SsrConfig::default()
                },
                Task::FewShot { supports, queries },
                DType::F32,
                1,
            )
            .unwrap();
            let path = dir.path().join(name);
            model.save(&path).unwrap();
            format!("ssr:{}", path.display())
        };
        // One node per class (prototypes) and one per shot both fit 3-way 2-shot episodes.
        for (name, supports) in [("prototypes.safetensors", 3), ("shots.safetensors", 6)] {
            let text = save(name, supports, 12);
            let m: EpisodeMethod = text.parse().unwrap();
            assert_eq!(m.to_string(), text);
            let acc = m.episode_accuracies(&x, &labels, &config, 8, 0).unwrap();
            assert_eq!(acc.accuracies.len(), 8);
            assert!(acc.accuracies.iter().all(|a| (0.0..=100.0).contains(a)));
        }
        // A model for other episodes: the error names the file and both shapes.
        let text = save("other.safetensors", 5, 25);
        let e = text
            .parse::<EpisodeMethod>()
            .unwrap()
            .episode_accuracies(&x, &labels, &config, 8, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other.safetensors") && e.contains("5 support nodes and 25 queries"),
            "{e}"
        );
    }
}

//! The data of a training run: [`load_data`] turns the recipe's `[dataset]` table
//! ([`DatasetConfig`](crate::data::loaders::DatasetConfig), one variant per dataset loader)
//! into the training [`ImageSource`] and the dataset's own test protocol ([`TestProtocol`]).
//!
//! **Test protocols** (the papers'): SOP, iNaturalist, CUB-200-2011, Cars196 and DyML-Product:
//! every test image is a query against all the other test images. In-Shop: queries against the
//! gallery. VehicleID: each of the Small / Medium / Large test sets on its own, every image a
//! query against the rest of its set (logged as `test_small`, `test_medium`, `test_large`).
//! DyML-Vehicle / -Animal: one query / gallery pair per semantic scale with that scale's labels,
//! and mAP, ASI and R@1 averaged over the scales (HAPPIER Table 2, [`evaluate_dyml`]).
//!
//! [`evaluate_dyml`]: crate::retrieval::dyml::evaluate_dyml

use super::config::TrainConfig;
use super::validation::{held_out_classes, split_indices, ValidationConfig};
use crate::data::dataset::InputNorm;
use crate::data::loaders::ImageList;
use crate::data::pipeline::{LoaderConfig, Normalize};
use crate::data::source::{ImageSource, InMemorySource, Normalization, OnDiskSource, SubsetSource};
use crate::data::{retrieval_split, EmbeddedConfig, ImageSet};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// One test set of a [`TestProtocol`].
#[derive(Clone)]
pub struct EvalSet {
    /// The `split` its metrics are logged under (`test`, `test_small`, `test_fine`, …).
    pub split: String,
    /// The queries.
    pub queries: Arc<dyn ImageSource>,
    /// The gallery the queries are ranked against; `None`: the queries against each other,
    /// each query removed from its own list.
    pub gallery: Option<Arc<dyn ImageSource>>,
}

/// How a dataset's test sets are evaluated.
#[derive(Clone)]
pub enum TestProtocol {
    /// Each set on its own with [`crate::retrieval::evaluate`], logged under its split.
    Separate(Vec<EvalSet>),
    /// The DyML protocol ([`crate::retrieval::dyml::evaluate_dyml`]): one query / gallery set per
    /// semantic scale, one label column each; mAP, ASI and R@1 per scale (logged under each
    /// set's split) and their averages (logged under `test`).
    DymlScales(Vec<EvalSet>),
}

impl TestProtocol {
    /// The test sets.
    pub fn sets(&self) -> &[EvalSet] {
        match self {
            TestProtocol::Separate(s) | TestProtocol::DymlScales(s) => s,
        }
    }
}

/// The training images and the test protocol of a run.
#[derive(Clone)]
pub struct RunData {
    /// The images the sampler draws batches from.
    pub train: Arc<dyn ImageSource>,
    /// The evaluation.
    pub test: TestProtocol,
}

impl RunData {
    /// In-memory training and test images (test images against each other, logged as `test`),
    /// normalised as `input_norm` says with the statistics of `train`.
    pub fn in_memory(train: ImageSet, test: ImageSet, input_norm: InputNorm) -> Result<Self> {
        let norm = input_normalization(input_norm, &train)?;
        let test = InMemorySource::new(test, norm.clone())?;
        let train = InMemorySource::new(train, norm)?;
        Ok(RunData {
            train: Arc::new(train),
            test: TestProtocol::Separate(vec![EvalSet {
                split: "test".into(),
                queries: Arc::new(test),
                gallery: None,
            }]),
        })
    }

    /// This data with the classes `config` holds out ([`held_out_classes`]) taken out of its
    /// training images, and the images of those classes (the validation set,
    /// [`super::validation`]).
    pub fn hold_out(self, config: &ValidationConfig) -> Result<(RunData, Arc<dyn ImageSource>)> {
        let classes = held_out_classes(self.train.labels(), config)?;
        let (kept, held) = split_indices(self.train.labels(), &classes);
        let val: Arc<dyn ImageSource> = Arc::new(SubsetSource::new(
            Arc::clone(&self.train),
            held,
            "validation classes",
        )?);
        let train: Arc<dyn ImageSource> =
            Arc::new(SubsetSource::new(self.train, kept, "training classes")?);
        Ok((
            RunData {
                train,
                test: self.test,
            },
            val,
        ))
    }
}

/// torchvision's ImageNet statistics, as [`Normalization`].
fn imagenet_normalization() -> Normalization {
    Normalization {
        mean: Normalize::IMAGENET.mean.to_vec(),
        std: Normalize::IMAGENET.std.to_vec(),
    }
}

/// The normalisation of in-memory images for `norm`: ImageNet statistics, none, or the
/// per-channel mean and standard deviation of the training images.
pub fn input_normalization(norm: InputNorm, train: &ImageSet) -> Result<Normalization> {
    let c = train.image_shape().0;
    match norm {
        InputNorm::None => Ok(Normalization::identity(c)),
        InputNorm::Imagenet => {
            if c != 3 {
                return Err(Error::invalid(
                    "input_norm",
                    format!("ImageNet statistics need 3 channels, the images have {c}"),
                ));
            }
            Ok(imagenet_normalization())
        }
        InputNorm::Dataset => {
            let stats = train.channel_mean_std();
            if let Some(ch) = stats.iter().position(|&(_, s)| s.is_nan() || s <= 0.0) {
                return Err(Error::invalid(
                    "input_norm",
                    format!("channel {ch} of the training images is constant; use `none`"),
                ));
            }
            Ok(Normalization {
                mean: stats.iter().map(|&(m, _)| m as f32).collect(),
                std: stats.iter().map(|&(_, s)| s as f32).collect(),
            })
        }
    }
}

/// The data of `config`: the embedded dataset generated from its settings, or the real dataset
/// of `config.dataset` read from disk. Errors for a real dataset name the missing folder or file
/// and the `data_scripts/` script that prepares it.
pub fn load_data(config: &TrainConfig) -> Result<RunData> {
    config.validate()?;
    if let Some(data) = config.dataset.embedded() {
        let (train, test) = embedded_split(data)?;
        return RunData::in_memory(train, test, config.input_norm);
    }
    let Some(dataset) = config.dataset.disk() else {
        return Err(Error::invalid(
            "dataset.kind",
            format!(
                "`{}` is neither embedded nor on disk",
                config.dataset.name()
            ),
        ));
    };
    let images = dataset.images();
    let root = dataset.root();
    let script = dataset.data_script();
    let hint = |e: Error| with_hint(e, script);
    if !root.is_dir() {
        return Err(Error::file(
            root,
            format!(
                "the {} dataset root is not an existing folder: prepare it with `{script}` \
                 (see data_scripts/README.md) and set `dataset.root` to the folder it creates",
                dataset.name()
            ),
        ));
    }
    let (train_t, test_t) = config.dataset.transforms(config.input_norm)?;
    let loader = LoaderConfig {
        threads: match images.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        },
        prefetch: images.prefetch,
        seed: config.seed,
    };
    let name = dataset.name();
    let source = |part: &str, list: ImageList| -> Result<Arc<dyn ImageSource>> {
        if images.check_files {
            list.check_files_exist().map_err(hint)?;
        }
        Ok(Arc::new(OnDiskSource::new(
            format!("{name} {part}"),
            list,
            train_t.clone(),
            test_t.clone(),
            loader,
        )?))
    };
    let lists = dataset.load().map_err(hint)?;
    let mut sets = Vec::with_capacity(lists.test.len());
    for set in lists.test {
        let (part, queries) = set.queries;
        sets.push(EvalSet {
            queries: source(&part, queries)?,
            gallery: match set.gallery {
                Some((part, gallery)) => Some(source(&part, gallery)?),
                None => None,
            },
            split: set.split,
        });
    }
    let test = if lists.dyml_scales {
        TestProtocol::DymlScales(sets)
    } else {
        TestProtocol::Separate(sets)
    };
    let train = lists.train;
    Ok(RunData {
        train: source("train", train)?,
        test,
    })
}

/// How many generator settings [`embedded_split`] keeps rendered: two runs train side by side.
const RENDERED_KEPT: usize = 2;

/// The train and test sides of the retrieval split of the embedded dataset `data`, rendered once
/// per process for the last [`RENDERED_KEPT`] settings asked for.
///
/// Rendering is deterministic in the generator's settings, and a `reproduce` or a notebook
/// trains many runs on the same settings (18 for FastAP at `quick`): rendering each run's copy
/// again was about 5% of a `quick` paper's time (perf, 2026-11-28). Each run still gets its own
/// copy of the images.
pub(crate) fn embedded_split(data: &EmbeddedConfig) -> Result<(ImageSet, ImageSet)> {
    type Rendered = Arc<(ImageSet, ImageSet)>;
    static KEPT: Mutex<Vec<(EmbeddedConfig, Rendered)>> = Mutex::new(Vec::new());
    // A panic elsewhere while the lock was held leaves complete entries only: keep using them.
    let mut kept = KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let sets = match kept.iter().position(|(settings, _)| settings == data) {
        Some(i) => {
            // Most recently used last, so that the oldest is the one to drop.
            let entry = kept.remove(i);
            let sets = entry.1.clone();
            kept.push(entry);
            sets
        }
        None => {
            let sets = Arc::new(render_split(data)?);
            kept.push((data.clone(), sets.clone()));
            if kept.len() > RENDERED_KEPT {
                kept.remove(0);
            }
            sets
        }
    };
    Ok((sets.0.clone(), sets.1.clone()))
}

/// The embedded dataset `data` rendered, then split for retrieval: what [`embedded_split`] keeps.
fn render_split(data: &EmbeddedConfig) -> Result<(ImageSet, ImageSet)> {
    let images = data.shapes().generate()?;
    let split = retrieval_split(images.labels(), data.split_level)?;
    Ok((images.select(&split.train)?, images.select(&split.test)?))
}

/// `e` with a pointer to the dataset's preparation script appended to its message.
fn with_hint(e: Error, script: &str) -> Error {
    let hint = format!(" (prepare the dataset with `{script}`, see data_scripts/README.md)");
    match e {
        Error::File { path, msg } => Error::File {
            path,
            msg: msg + &hint,
        },
        Error::Line { path, line, msg } => Error::Line {
            path,
            line,
            msg: msg + &hint,
        },
        Error::Io { path, error } => Error::File {
            path,
            msg: format!("{error}{hint}"),
        },
        other => other,
    }
}

/// What a recipe's loader and sampler make of the dataset at its `dataset.root`
/// ([`check_recipe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeCheck {
    /// Training images.
    pub train_images: usize,
    /// Batches of epoch 0.
    pub batches: usize,
    /// Batches of epoch 0 with the sampler's full batch size.
    pub full_batches: usize,
    /// Each test set of the protocol: its split name, queries and gallery size (`None`: the
    /// queries are ranked against each other).
    pub test_sets: Vec<(String, usize, Option<usize>)>,
}

/// Loads the dataset of `config` through its loader (every listed file checked to exist) and
/// builds its sampler: errors unless epoch 0 has a full batch and every test set can be
/// evaluated (a query needs at least one other image to rank).
pub fn check_recipe(config: &TrainConfig) -> Result<RecipeCheck> {
    let data = load_data(config)?;
    let sampler = config.sampler.build(data.train.labels(), config.seed)?;
    let batches = sampler.batches(0);
    let size = config.sampler.batch_size();
    let full_batches = batches.iter().filter(|b| b.len() == size).count();
    if full_batches == 0 {
        return Err(Error::invalid(
            "sampler",
            format!(
                "epoch 0 of the {} training images has no full batch of {size} ({} shorter \
                 batches)",
                data.train.len(),
                batches.len()
            ),
        ));
    }
    let test_sets = data
        .test
        .sets()
        .iter()
        .map(|s| {
            (
                s.split.clone(),
                s.queries.len(),
                s.gallery.as_ref().map(|g| g.len()),
            )
        })
        .collect::<Vec<_>>();
    if let Some((split, ..)) = test_sets
        .iter()
        .find(|(_, q, g)| g.unwrap_or(q.saturating_sub(1)) == 0)
    {
        return Err(Error::invalid(
            "dataset",
            format!("test set `{split}` has nothing to rank its queries against"),
        ));
    }
    Ok(RecipeCheck {
        train_images: data.train.len(),
        batches: batches.len(),
        full_batches,
        test_sets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small settings: 2 × 2 × 2 fine classes of 4 images of 8 × 8.
    fn small(seed: u64) -> EmbeddedConfig {
        EmbeddedConfig {
            seed,
            families: 2,
            variants_per_family: 2,
            fine_per_variant: 2,
            images_per_class: 4,
            image_size: 8,
            ..EmbeddedConfig::default()
        }
    }

    /// What the kept renderings give equals a fresh rendering of the same settings, whichever
    /// settings were asked for in between (more than are kept).
    #[test]
    fn kept_renderings_equal_fresh_ones() {
        let fresh = |data: &EmbeddedConfig| render_split(data).unwrap();
        let settings: Vec<_> = (0..RENDERED_KEPT as u64 + 2)
            .map(|s| small(900 + s))
            .collect();
        for round in 0..2 {
            for data in &settings {
                assert_eq!(embedded_split(data).unwrap(), fresh(data), "round {round}");
            }
        }
        assert_ne!(fresh(&settings[0]), fresh(&settings[1]), "the seed matters");
    }

    #[test]
    fn hints_keep_the_path_and_line() {
        let e = with_hint(Error::line("a.txt", 3, "bad"), "data_scripts/sop.sh");
        let msg = e.to_string();
        assert!(
            msg.starts_with("a.txt:3: bad") && msg.contains("data_scripts/sop.sh"),
            "{msg}"
        );
    }
}

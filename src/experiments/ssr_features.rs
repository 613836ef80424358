//! SSR at the paper's scale: frozen features read from files instead of the embedded dataset's
//! backbone.
//!
//! SSR never trains a backbone: every table of the paper re-ranks or classifies with **frozen,
//! pre-extracted features** (Table 1: the GL / PA / PNCA++ features of CUB, CARS and SOP, and
//! the features of \[17\] for rOxford5k / rParis6k, meta-trained on SfM120k; Table 2: cosine
//! classifiers' features on mini-ImageNet, tiered-ImageNet and CIFAR-FS). A user with those
//! features — extracted with `rankwise embed` from a model they trained, or converted from the
//! authors' releases to `.npy` — points the `[paper]` section of `configs/experiments/ssr.toml`
//! at them:
//!
//! * a [`FeatureSet`] per table (few-shot, retrieval): base classes (meta-training), validation
//!   classes (the choice of `λ`, `k`, `T`) and novel classes (the reported numbers), each an
//!   embeddings file and a labels file ([`crate::io::LabelledEmbeddings`]), plus the paper's
//!   column the numbers stand beside;
//! * a [`LandmarkSet`] for the revisited Oxford / Paris columns: SSR meta-trained on the base /
//!   validation split of the training landmarks' features (SfM120k in the paper), then each
//!   test set's query and database features ranked and scored with revisitop's Medium and Hard
//!   mAP against the ground truth read by [`crate::data::loaders::revisited::load`].
//!
//! Every path is checked when the experiment runs (a missing file is an error naming it), not
//! when the recipe is parsed, so the recipe shipped in `configs/` validates on machines without
//! the data.

use crate::data::loaders::revisited::{self, Landmarks};
use crate::error::{Error, Result};
use crate::fewshot::SplitFeatures;
use crate::io::LabelledEmbeddings;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Features and their labels.
pub type Split = (candle_core::Tensor, crate::hierarchy::Labels);

/// An embeddings file and its labels (one row per item, in the same order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureFiles {
    /// `N × D` features: `.npy` (float32/float64) or `.safetensors`
    /// ([`crate::io::read_embeddings`]).
    pub features: PathBuf,
    /// `.csv` or `.parquet` labels ([`crate::io::read_labels`]).
    pub labels: PathBuf,
    /// The label columns to use, finest first (absent: every column of the file).
    #[serde(default)]
    pub label_columns: Option<Vec<String>>,
    /// The tensor to read from a `.safetensors` file holding several.
    #[serde(default)]
    pub tensor: Option<String>,
}

impl FeatureFiles {
    /// Reads both files, relative paths resolved against `root`.
    pub fn read(&self, root: &Path) -> Result<LabelledEmbeddings> {
        LabelledEmbeddings::read(
            &root.join(&self.features),
            &root.join(&self.labels),
            self.label_columns.as_deref(),
            self.tensor.as_deref(),
        )
    }
}

/// The paper's column that our numbers stand beside (e.g. `CUB` with `feature=GL`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    /// Dataset, as in `paper_tables/published/ssr.csv` (`CUB`, `CARS`, `SOP`, `mini-ImageNet`,
    /// `tiered-ImageNet`, `CIFAR-FS`).
    pub dataset: String,
    /// Setting, as in `paper_tables/published/ssr.csv` (`feature=GL`, `backbone=WRN-28-10`, …).
    pub setting: String,
}

/// Frozen features of the three class splits of one table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSet {
    /// Where the numbers go in the paper's table.
    pub column: Column,
    /// How the features were made (backbone, training, resolution), for the table's provenance.
    pub describe: String,
    /// Meta-training classes.
    pub base: FeatureFiles,
    /// Selection classes (disjoint from the others).
    pub validation: FeatureFiles,
    /// Reported classes.
    pub novel: FeatureFiles,
}

impl FeatureSet {
    /// Reads the three splits (relative paths against `root`); the base and validation splits
    /// must use the feature width of the novel split.
    pub fn read(&self, root: &Path) -> Result<SplitFeatures> {
        let [base, val, novel] = [&self.base, &self.validation, &self.novel].map(|f| {
            f.read(root)
                .map(|le| (le.embeddings, le.labels, root.join(&f.features)))
        });
        let (base, val, novel) = (base?, val?, novel?);
        same_width(&[(&base.0, &base.2), (&val.0, &val.2), (&novel.0, &novel.2)])?;
        Ok(SplitFeatures {
            base: (base.0, base.1),
            val: (val.0, val.1),
            novel: (novel.0, novel.1),
            report: None,
        })
    }
}

/// Errors naming the first file whose feature width differs from the first one's.
fn same_width(features: &[(&candle_core::Tensor, &PathBuf)]) -> Result<()> {
    let Some((first, first_path)) = features.first() else {
        return Ok(());
    };
    let d = first.dim(1)?;
    for (t, path) in &features[1..] {
        let dt = t.dim(1)?;
        if dt != d {
            return Err(Error::file(
                path,
                format!(
                    "features have {dt} columns but {} has {d}: every split must come from the \
                     same extractor",
                    first_path.display()
                ),
            ));
        }
    }
    Ok(())
}

/// One revisited landmark test set: the features of its queries and of its database, in the
/// order of the ground truth's `qimlist` and `imlist`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandmarkTest {
    /// `roxford5k` or `rparis6k`.
    pub name: String,
    /// `70 × D` query features (the queries cropped to their `bbx`, as revisitop prescribes).
    pub queries: PathBuf,
    /// `n × D` database features.
    pub database: PathBuf,
}

impl LandmarkTest {
    /// The dataset.
    pub fn landmarks(&self) -> Result<Landmarks> {
        match self.name.as_str() {
            "roxford5k" => Ok(Landmarks::Oxford5k),
            "rparis6k" => Ok(Landmarks::Paris6k),
            other => Err(Error::invalid(
                "landmarks.tests.name",
                format!("expected roxford5k or rparis6k, got '{other}'"),
            )),
        }
    }

    /// The paper's dataset column (`rOxford5K` / `rParis6K`).
    pub fn column_dataset(&self) -> Result<&'static str> {
        Ok(match self.landmarks()? {
            Landmarks::Oxford5k => "rOxford5K",
            Landmarks::Paris6k => "rParis6K",
        })
    }
}

/// The revisited landmark columns of SSR Table 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandmarkSet {
    /// The setting of the paper's columns (`feature=[17]`).
    pub setting: String,
    /// How the features were made, for the provenance.
    pub describe: String,
    /// Meta-training landmarks (SfM120k clusters in the paper).
    pub base: FeatureFiles,
    /// Selection landmarks, disjoint from `base` (the authors select on the test sets; we do
    /// not).
    pub validation: FeatureFiles,
    /// revisitop's `data/datasets` folder (`roxford5k/gnd_roxford5k.pkl`, …).
    pub data_root: PathBuf,
    /// The test sets.
    pub tests: Vec<LandmarkTest>,
}

/// One landmark test set, loaded and checked.
pub struct LoadedLandmarkTest {
    /// The paper's dataset column.
    pub dataset: &'static str,
    /// Query features.
    pub queries: candle_core::Tensor,
    /// Database features.
    pub database: candle_core::Tensor,
    /// Easy / hard / junk database indices per query.
    pub ground_truth: Vec<crate::metrics::revisited::GroundTruth>,
}

impl LandmarkSet {
    /// Checks the test names (paths are checked when read).
    pub fn validate(&self) -> Result<()> {
        if self.tests.is_empty() {
            return Err(Error::invalid(
                "landmarks.tests",
                "list at least one test set",
            ));
        }
        for t in &self.tests {
            t.landmarks()?;
        }
        Ok(())
    }

    /// The meta-training and selection features with their width (the test sets are query /
    /// database pairs, see [`LandmarkSet::read_test`]).
    pub fn read_train(&self, root: &Path) -> Result<(Split, Split, usize)> {
        let base = self.base.read(root)?;
        let val = self.validation.read(root)?;
        let (bp, vp) = (
            root.join(&self.base.features),
            root.join(&self.validation.features),
        );
        same_width(&[(&base.embeddings, &bp), (&val.embeddings, &vp)])?;
        let d = base.embeddings.dim(1)?;
        Ok((
            (base.embeddings, base.labels),
            (val.embeddings, val.labels),
            d,
        ))
    }

    /// Reads a test set's ground truth and features and checks that they agree: as many query
    /// rows as `qimlist` entries, database rows as `imlist` entries, and `dim` columns.
    pub fn read_test(
        &self,
        root: &Path,
        test: &LandmarkTest,
        dim: usize,
    ) -> Result<LoadedLandmarkTest> {
        let gnd = revisited::load(root.join(&self.data_root), test.landmarks()?)?;
        let q_path = root.join(&test.queries);
        let db_path = root.join(&test.database);
        let queries = crate::io::read_embeddings(&q_path, None)?;
        let database = crate::io::read_embeddings(&db_path, None)?;
        for (t, path, want, what) in [
            (&queries, &q_path, gnd.queries.len(), "queries (qimlist)"),
            (
                &database,
                &db_path,
                gnd.database.len(),
                "database images (imlist)",
            ),
        ] {
            let (n, d) = t.dims2()?;
            if n != want {
                return Err(Error::file(
                    path,
                    format!(
                        "{n} feature rows, but the ground truth of {} lists {want} {what}",
                        test.name
                    ),
                ));
            }
            if d != dim {
                return Err(Error::file(
                    path,
                    format!("features have {d} columns but the training features have {dim}"),
                ));
            }
        }
        Ok(LoadedLandmarkTest {
            dataset: test.column_dataset()?,
            queries,
            database,
            ground_truth: gnd.ground_truth,
        })
    }
}

/// The feature sets of the paper scale; each absent part is skipped.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsrFeatureSets {
    /// Table 2's features.
    #[serde(default)]
    pub few_shot: Option<FeatureSet>,
    /// Table 1's features for the mAP@R columns (CUB / CARS / SOP).
    #[serde(default)]
    pub retrieval: Option<FeatureSet>,
    /// Table 1's revisited landmark columns.
    #[serde(default)]
    pub landmarks: Option<LandmarkSet>,
}

impl SsrFeatureSets {
    /// Errors if nothing is listed or a landmark test is unknown.
    pub fn validate(&self) -> Result<()> {
        if self.few_shot.is_none() && self.retrieval.is_none() && self.landmarks.is_none() {
            return Err(Error::invalid(
                "features",
                "list at least one of few_shot, retrieval, landmarks",
            ));
        }
        if let Some(l) = &self.landmarks {
            l.validate()?;
        }
        Ok(())
    }
}

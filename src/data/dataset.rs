//! The datasets a recipe can name: the `[dataset]` table ([`DatasetConfig`], tagged by `kind`)
//! chooses the embedded dataset (the default, generated from `[data]`) or a real dataset on
//! disk, with the image transforms and decoding threads. This is the one list of datasets:
//! training ([`crate::train::load_data`]), the data scripts' hints and the synthetic on-disk
//! copies ([`super::synthetic_on_disk`]) all read it.
//!
//! ```toml
//! [dataset]
//! kind = "sop"                         # embedded | sop | inaturalist | dyml | cub | cars | inshop | vehicleid
//! root = "/data/Stanford_Online_Products"
//!
//! [dataset.images]
//! train_transform = "happier_sop_train"
//! test_transform = "happier_sop_test"
//! threads = 8                          # decoding threads (0 = all cores)
//! ```

use super::pipeline::{Normalize, Op, Resize, Transform};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How images are normalised before the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputNorm {
    /// Per-channel mean and standard deviation of the training images.
    #[default]
    Dataset,
    /// torchvision's ImageNet statistics (for pretrained backbones).
    Imagenet,
    /// None.
    None,
}

/// Which dataset a recipe trains and evaluates on (`[dataset]`, tagged by `kind`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DatasetConfig {
    /// The embedded shapes dataset of `[data]` ([`crate::train::DataConfig`]) and its
    /// class-disjoint retrieval split, in memory. Default.
    #[default]
    Embedded,
    /// Stanford Online Products ([`sop`](super::loaders::sop)): labels `[class, super-class]`.
    Sop {
        /// The unpacked `Stanford_Online_Products/` folder (`data_scripts/sop.sh`).
        root: PathBuf,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
    /// iNaturalist-2018 with Smooth-AP's retrieval split
    /// ([`inaturalist`](super::loaders::inaturalist)): iNat-base `[species, super-category]` or
    /// iNat-full (7 levels), HAPPIER's two hierarchies.
    Inaturalist {
        /// The folder holding `train_val2018/`, `Inat_dataset_splits/` and the category list
        /// (`data_scripts/inaturalist.sh`).
        root: PathBuf,
        /// `base` (2 levels) or `full` (7 levels).
        #[serde(default)]
        hierarchy: InatLevels,
        /// How iNat-full keys the taxa above species: `lineage` (default, always a tree) or
        /// `name` (HAPPIER's code).
        #[serde(default)]
        taxon_key: TaxonKeying,
        /// The category list to read instead of `train2018.json` / `categories.json`.
        #[serde(default)]
        taxonomy_file: Option<PathBuf>,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
    /// DyML-Vehicle, -Animal or -Product ([`dyml`](super::loaders::dyml)): training labels `[fine,
    /// middle, coarse]`.
    Dyml {
        /// The `dyml_vehicle/`, `dyml_animal/` or `dyml_product/` folder (`data_scripts/dyml.sh`).
        root: PathBuf,
        /// Which of the three.
        subset: DymlSubset,
        /// The csv row glued to the header: `keep` (default, the DyML authors' loader) or `drop`
        /// (HAPPIER's pandas reading).
        #[serde(default)]
        glued_row: GluedRowChoice,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
    /// CUB-200-2011 ([`cub_cars`](super::loaders::cub_cars)): first 100 classes for training, last
    /// 100 for test.
    Cub {
        /// The unpacked `CUB_200_2011/` folder (`data_scripts/cub.sh`).
        root: PathBuf,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
    /// Cars196 ([`cub_cars`](super::loaders::cub_cars)): first 98 classes for training, last 98 for
    /// test.
    Cars {
        /// The folder holding `cars_annos.mat` and `car_ims/` (`data_scripts/cars196.sh`).
        root: PathBuf,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
    /// In-Shop Clothes ([`inshop`](super::loaders::inshop)): labels `[item, category]`; queries
    /// against the gallery.
    Inshop {
        /// The "In-shop Clothes Retrieval Benchmark" folder (`data_scripts/inshop.sh`).
        root: PathBuf,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
    /// PKU VehicleID ([`vehicleid`](super::loaders::vehicleid)): flat vehicle labels; Small /Medium
    /// /Large test sets.
    #[serde(rename = "vehicleid")]
    VehicleId {
        /// The `VehicleID_V1.0/` folder (`data_scripts/vehicleid.sh`).
        root: PathBuf,
        /// The test sets to evaluate (default all three).
        #[serde(default = "all_vehicleid_sizes")]
        test_sizes: Vec<VehicleIdSize>,
        /// Transforms and decoding.
        #[serde(default)]
        images: ImageSettings,
    },
}

/// iNaturalist hierarchy, as named in a recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InatLevels {
    /// iNat-base: `[species, super-category]`.
    #[default]
    Base,
    /// iNat-full: `[species, genus, family, order, class, phylum, kingdom]`.
    Full,
}

/// How iNat-full keys the taxa above species ([`TaxonKey`](super::loaders::inaturalist::TaxonKey)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaxonKeying {
    /// By lineage (homonyms stay apart).
    #[default]
    Lineage,
    /// By name alone, as HAPPIER's code.
    Name,
}

/// The three DyML datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DymlSubset {
    /// DyML-Vehicle: per-scale query / gallery test sets.
    Vehicle,
    /// DyML-Animal: per-scale query / gallery test sets.
    Animal,
    /// DyML-Product: one three-level test set, every image a query.
    Product,
}

/// The row glued to the header of the DyML csv files
/// ([`GluedRow`](super::loaders::dyml::GluedRow)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GluedRowChoice {
    /// Keep it (the DyML authors' loader).
    #[default]
    Keep,
    /// Drop it (HAPPIER's pandas reading).
    Drop,
}

/// A VehicleID test set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VehicleIdSize {
    /// 800 vehicles.
    Small,
    /// 1,600 vehicles.
    Medium,
    /// 2,400 vehicles.
    Large,
}

fn all_vehicleid_sizes() -> Vec<VehicleIdSize> {
    vec![
        VehicleIdSize::Small,
        VehicleIdSize::Medium,
        VehicleIdSize::Large,
    ]
}

/// A preprocessing of the papers' code or text (torchvision semantics, [`Transform`]); every
/// preset ends with a 224 × 224 crop (scaled by [`ImageSettings::crop_size`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransformPreset {
    /// Smooth-AP's code (`datasets.py`): `RandomResizedCrop(224)` (scale (0.08, 1)) + flip.
    RetrievalTrain,
    /// Smooth-AP's code and HAPPIER on iNat / DyML, test: `Resize(256)` + `CenterCrop(224)`.
    RetrievalTest,
    /// HAPPIER on SOP: `Resize(256)` + `RandomResizedCrop(224, (0.16, 1), (0.75, 1.33))` + flip.
    HappierSopTrain,
    /// HAPPIER on SOP, test: `Resize((256, 256))` + `CenterCrop(224)`.
    HappierSopTest,
    /// HAPPIER on iNaturalist and DyML: `RandomResizedCrop(224, (0.16, 1), (0.75, 1.33))` + flip.
    HappierInatTrain,
    /// The text of Smooth-AP (§4.1) and RaMBO (§5.1): images resized to 256 × 256, a random
    /// 224 × 224 crop and a horizontal flip.
    SquareRandomCrop,
    /// The text of Smooth-AP and RaMBO, test: resized to 256 × 256, centre crop 224 × 224 (the
    /// same steps as [`TransformPreset::HappierSopTest`]).
    SquareCenterCrop,
}

impl TransformPreset {
    /// The transform with ImageNet normalisation and the papers' sizes.
    pub fn transform(self) -> Transform {
        match self {
            TransformPreset::RetrievalTrain => Transform::retrieval_train(),
            TransformPreset::RetrievalTest => Transform::retrieval_test(),
            TransformPreset::HappierSopTrain => Transform::happier_sop_train(),
            TransformPreset::HappierSopTest | TransformPreset::SquareCenterCrop => {
                Transform::happier_sop_test()
            }
            TransformPreset::HappierInatTrain => Transform::happier_inat_train(),
            TransformPreset::SquareRandomCrop => Transform {
                ops: vec![
                    Op::Resize(Resize::Exact {
                        height: 256,
                        width: 256,
                    }),
                    Op::RandomCrop {
                        height: 224,
                        width: 224,
                        padding: 0,
                    },
                    Op::HorizontalFlip { p: 0.5 },
                ],
                normalize: Normalize::IMAGENET,
            },
        }
    }
}

/// The crop size of every preset.
const PRESET_CROP: u32 = 224;

/// How the images of a real dataset become network input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageSettings {
    /// Training preprocessing; default: the dataset's ([`DatasetConfig::default_transforms`]).
    pub train_transform: Option<TransformPreset>,
    /// Test preprocessing; default: the dataset's.
    pub test_transform: Option<TransformPreset>,
    /// Final crop side in pixels: every pixel size of the presets is scaled by
    /// `crop_size / 224` (resize 256 → `round(256 · crop_size / 224)`), for quick runs on small
    /// images; `None` keeps the papers' 224.
    pub crop_size: Option<u32>,
    /// Decoding threads; 0 = one per core.
    pub threads: usize,
    /// Batches decoded ahead of the one being trained on.
    pub prefetch: usize,
    /// Check that every listed image file exists before training (seconds for 100k images), so
    /// an incomplete download fails at once rather than mid-epoch.
    pub check_files: bool,
}

impl Default for ImageSettings {
    fn default() -> Self {
        ImageSettings {
            train_transform: None,
            test_transform: None,
            crop_size: None,
            threads: 0,
            prefetch: 2,
            check_files: true,
        }
    }
}

impl DatasetConfig {
    /// This dataset with its root replaced by `root` (errors for the embedded dataset).
    pub fn with_root(&self, root: &Path) -> Result<DatasetConfig> {
        let mut config = self.clone();
        match &mut config {
            DatasetConfig::Embedded => {
                return Err(Error::invalid(
                    "dataset.kind",
                    "the embedded dataset has no root",
                ))
            }
            DatasetConfig::Sop { root: r, .. }
            | DatasetConfig::Inaturalist { root: r, .. }
            | DatasetConfig::Dyml { root: r, .. }
            | DatasetConfig::Cub { root: r, .. }
            | DatasetConfig::Cars { root: r, .. }
            | DatasetConfig::Inshop { root: r, .. }
            | DatasetConfig::VehicleId { root: r, .. } => *r = root.to_path_buf(),
        }
        Ok(config)
    }

    /// The dataset's name in logs and errors (`sop`, `dyml_vehicle`, …).
    pub fn name(&self) -> String {
        match self {
            DatasetConfig::Embedded => "embedded".into(),
            DatasetConfig::Sop { .. } => "sop".into(),
            DatasetConfig::Inaturalist { hierarchy, .. } => match hierarchy {
                InatLevels::Base => "inat_base".into(),
                InatLevels::Full => "inat_full".into(),
            },
            DatasetConfig::Dyml { subset, .. } => match subset {
                DymlSubset::Vehicle => "dyml_vehicle".into(),
                DymlSubset::Animal => "dyml_animal".into(),
                DymlSubset::Product => "dyml_product".into(),
            },
            DatasetConfig::Cub { .. } => "cub".into(),
            DatasetConfig::Cars { .. } => "cars".into(),
            DatasetConfig::Inshop { .. } => "inshop".into(),
            DatasetConfig::VehicleId { .. } => "vehicleid".into(),
        }
    }

    /// The dataset root, for a real dataset.
    pub fn root(&self) -> Option<&Path> {
        match self {
            DatasetConfig::Embedded => None,
            DatasetConfig::Sop { root, .. }
            | DatasetConfig::Inaturalist { root, .. }
            | DatasetConfig::Dyml { root, .. }
            | DatasetConfig::Cub { root, .. }
            | DatasetConfig::Cars { root, .. }
            | DatasetConfig::Inshop { root, .. }
            | DatasetConfig::VehicleId { root, .. } => Some(root),
        }
    }

    /// The image settings, for a real dataset.
    pub fn images(&self) -> Option<&ImageSettings> {
        match self {
            DatasetConfig::Embedded => None,
            DatasetConfig::Sop { images, .. }
            | DatasetConfig::Inaturalist { images, .. }
            | DatasetConfig::Dyml { images, .. }
            | DatasetConfig::Cub { images, .. }
            | DatasetConfig::Cars { images, .. }
            | DatasetConfig::Inshop { images, .. }
            | DatasetConfig::VehicleId { images, .. } => Some(images),
        }
    }

    fn images_mut(&mut self) -> Option<&mut ImageSettings> {
        match self {
            DatasetConfig::Embedded => None,
            DatasetConfig::Sop { images, .. }
            | DatasetConfig::Inaturalist { images, .. }
            | DatasetConfig::Dyml { images, .. }
            | DatasetConfig::Cub { images, .. }
            | DatasetConfig::Cars { images, .. }
            | DatasetConfig::Inshop { images, .. }
            | DatasetConfig::VehicleId { images, .. } => Some(images),
        }
    }

    /// The script of `data_scripts/` that prepares the dataset.
    pub fn data_script(&self) -> Option<&'static str> {
        Some(match self {
            DatasetConfig::Embedded => return None,
            DatasetConfig::Sop { .. } => "data_scripts/sop.sh",
            DatasetConfig::Inaturalist { .. } => "data_scripts/inaturalist.sh",
            DatasetConfig::Dyml { .. } => "data_scripts/dyml.sh",
            DatasetConfig::Cub { .. } => "data_scripts/cub.sh",
            DatasetConfig::Cars { .. } => "data_scripts/cars196.sh",
            DatasetConfig::Inshop { .. } => "data_scripts/inshop.sh",
            DatasetConfig::VehicleId { .. } => "data_scripts/vehicleid.sh",
        })
    }

    /// The default `(train, test)` presets of the dataset: HAPPIER's for SOP, iNaturalist and
    /// DyML (the only paper among the five that trains on them with published transforms), and
    /// the papers' text for CUB, Cars196, In-Shop and VehicleID (256 × 256, random / centre 224
    /// crop: Smooth-AP §4.1, RaMBO §5.1). `None` for the embedded dataset.
    pub fn default_transforms(&self) -> Option<(TransformPreset, TransformPreset)> {
        use TransformPreset::*;
        Some(match self {
            DatasetConfig::Embedded => return None,
            DatasetConfig::Sop { .. } => (HappierSopTrain, HappierSopTest),
            DatasetConfig::Inaturalist { .. } | DatasetConfig::Dyml { .. } => {
                (HappierInatTrain, RetrievalTest)
            }
            DatasetConfig::Cub { .. }
            | DatasetConfig::Cars { .. }
            | DatasetConfig::Inshop { .. }
            | DatasetConfig::VehicleId { .. } => (SquareRandomCrop, SquareCenterCrop),
        })
    }

    /// The configuration with the settings that do not change the images, labels or batches
    /// blanked (the root, decoding threads, prefetch depth and file check): two runs whose
    /// results must agree (a resumed checkpoint) compare this.
    pub fn identity(&self) -> DatasetConfig {
        let mut c = self.clone();
        if let Some(images) = c.images_mut() {
            images.threads = 0;
            images.prefetch = ImageSettings::default().prefetch;
            images.check_files = true;
        }
        match &mut c {
            DatasetConfig::Embedded => {}
            DatasetConfig::Sop { root, .. }
            | DatasetConfig::Inaturalist { root, .. }
            | DatasetConfig::Dyml { root, .. }
            | DatasetConfig::Cub { root, .. }
            | DatasetConfig::Cars { root, .. }
            | DatasetConfig::Inshop { root, .. }
            | DatasetConfig::VehicleId { root, .. } => *root = PathBuf::new(),
        }
        c
    }

    /// Errors naming the first invalid field (`dataset.<field>`) that can be checked without
    /// reading the data; `input_norm` must be `imagenet` or `none` for a real dataset (the
    /// statistics of a dataset on disk are not computed).
    pub fn validate(&self, input_norm: InputNorm) -> Result<()> {
        let Some(images) = self.images() else {
            return Ok(());
        };
        if self.root().is_some_and(|r| r.as_os_str().is_empty()) {
            return Err(Error::invalid(
                "dataset.root",
                "must name the dataset folder",
            ));
        }
        if images.prefetch == 0 {
            return Err(Error::invalid("dataset.images.prefetch", "must be ≥ 1"));
        }
        if images.crop_size == Some(0) {
            return Err(Error::invalid("dataset.images.crop_size", "must be ≥ 1"));
        }
        if let DatasetConfig::VehicleId { test_sizes, .. } = self {
            if test_sizes.is_empty() {
                return Err(Error::invalid(
                    "dataset.test_sizes",
                    "list at least one of small, medium, large",
                ));
            }
        }
        if input_norm == InputNorm::Dataset {
            return Err(Error::invalid(
                "input_norm",
                format!(
                    "`dataset` statistics are computed only for the embedded dataset; the {} \
                     images are normalised with `imagenet` (the papers' torchvision Normalize) \
                     or `none`",
                    self.name()
                ),
            ));
        }
        let (train, test) = self.transforms(input_norm)?;
        train.validate()?;
        test.validate()
    }

    /// The `(train, test)` transforms: the presets (or the dataset's defaults) scaled to
    /// `crop_size`, normalised as `input_norm` says. Errors for the embedded dataset.
    pub fn transforms(&self, input_norm: InputNorm) -> Result<(Transform, Transform)> {
        let (Some(images), Some((train_default, test_default))) =
            (self.images(), self.default_transforms())
        else {
            return Err(Error::invalid(
                "dataset",
                "the embedded dataset has no image transforms",
            ));
        };
        let normalize = match input_norm {
            InputNorm::Imagenet => Normalize::IMAGENET,
            InputNorm::None => Normalize::NONE,
            InputNorm::Dataset => {
                return Err(Error::invalid(
                    "input_norm",
                    "use `imagenet` or `none` for a dataset on disk",
                ))
            }
        };
        let build = |preset: TransformPreset| {
            let t = preset.transform();
            let t = match images.crop_size {
                Some(s) => scale_sizes(&t, s),
                None => t,
            };
            Transform { normalize, ..t }
        };
        Ok((
            build(images.train_transform.unwrap_or(train_default)),
            build(images.test_transform.unwrap_or(test_default)),
        ))
    }
}

/// `transform` with every pixel size `v` (resizes, crops, padding) replaced by
/// `round(v · crop / 224)`, at least 1 (padding may become 0): the preset for a final crop of
/// `crop` instead of 224.
pub fn scale_sizes(transform: &Transform, crop: u32) -> Transform {
    let s =
        |v: u32| -> u32 { ((v as f64 * crop as f64 / PRESET_CROP as f64).round() as u32).max(1) };
    let ops = transform
        .ops
        .iter()
        .map(|op| match *op {
            Op::Resize(Resize::ShorterSide(v)) => Op::Resize(Resize::ShorterSide(s(v))),
            Op::Resize(Resize::Exact { height, width }) => Op::Resize(Resize::Exact {
                height: s(height),
                width: s(width),
            }),
            Op::CenterCrop { height, width } => Op::CenterCrop {
                height: s(height),
                width: s(width),
            },
            Op::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            } => Op::RandomResizedCrop {
                height: s(height),
                width: s(width),
                scale,
                ratio,
            },
            Op::RandomCrop {
                height,
                width,
                padding,
            } => Op::RandomCrop {
                height: s(height),
                width: s(width),
                padding: (padding as f64 * crop as f64 / PRESET_CROP as f64).round() as u32,
            },
            Op::HorizontalFlip { p } => Op::HorizontalFlip { p },
        })
        .collect();
    Transform {
        ops,
        normalize: transform.normalize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_scale_to_a_smaller_crop() {
        let t = scale_sizes(&TransformPreset::HappierSopTrain.transform(), 56);
        assert_eq!(t.ops[0], Op::Resize(Resize::ShorterSide(64)));
        assert!(matches!(
            t.ops[1],
            Op::RandomResizedCrop {
                height: 56,
                width: 56,
                ..
            }
        ));
        assert_eq!(t.ops[2], Op::HorizontalFlip { p: 0.5 });
        let t = scale_sizes(&TransformPreset::SquareRandomCrop.transform(), 32);
        assert_eq!(
            t.ops[..2],
            [
                Op::Resize(Resize::Exact {
                    height: 37,
                    width: 37
                }),
                Op::RandomCrop {
                    height: 32,
                    width: 32,
                    padding: 0
                }
            ]
        );
        // 224 itself is the identity.
        let t = TransformPreset::RetrievalTest.transform();
        assert_eq!(scale_sizes(&t, 224), t);
    }

    #[test]
    fn real_datasets_need_imagenet_or_no_normalisation() {
        let sop = DatasetConfig::Sop {
            root: "/data/sop".into(),
            images: ImageSettings::default(),
        };
        let e = sop.validate(InputNorm::Dataset).unwrap_err().to_string();
        assert!(e.contains("input_norm") && e.contains("imagenet"), "{e}");
        sop.validate(InputNorm::Imagenet).unwrap();
        let (train, test) = sop.transforms(InputNorm::None).unwrap();
        assert_eq!(train.normalize, Normalize::NONE);
        assert_eq!(
            test,
            Transform {
                normalize: Normalize::NONE,
                ..Transform::happier_sop_test()
            }
        );
        assert!(DatasetConfig::Embedded.validate(InputNorm::Dataset).is_ok());
        let vid = DatasetConfig::VehicleId {
            root: "/data/v".into(),
            test_sizes: Vec::new(),
            images: ImageSettings::default(),
        };
        let e = vid.validate(InputNorm::Imagenet).unwrap_err().to_string();
        assert!(e.contains("dataset.test_sizes"), "{e}");
    }

    #[test]
    fn identity_ignores_root_and_decoding_settings() {
        let a = DatasetConfig::Cub {
            root: "/a".into(),
            images: ImageSettings::default(),
        };
        let b = DatasetConfig::Cub {
            root: "/b".into(),
            images: ImageSettings {
                threads: 3,
                prefetch: 5,
                check_files: false,
                ..ImageSettings::default()
            },
        };
        assert_eq!(a.identity(), b.identity());
        let c = DatasetConfig::Cub {
            root: "/a".into(),
            images: ImageSettings {
                crop_size: Some(64),
                ..ImageSettings::default()
            },
        };
        assert_ne!(a.identity(), c.identity());
    }
}

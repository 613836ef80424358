//! Synthetic datasets written in the exact on-disk formats of the papers' datasets: the list
//! files, folder names and JPEG images that `data_scripts/` lays out, so that a paper recipe
//! (`configs/paper/`) runs end to end — its loader, the image pipeline with its prefetching
//! threads, its sampler and its test protocol — on a machine without the real data.
//!
//! | [`SyntheticKind`] | root as written (the real archive's folder) | levels | test protocol |
//! |---|---|---|---|
//! | `sop` | `Ebay_{train,test}.txt`, `<super>_final/<id>_<k>.JPG` | 2 | test vs test |
//! | `inshop` | `Eval/list_eval_partition.txt`, `Img/img/<GENDER>/<Category>/id_…/…jpg` | 2 | query vs gallery |
//! | `inat_base`, `inat_full` | `train_val2018/<super>/<species>/<hash>.jpg`, `train2018.json`, `categories.json`, `Inat_dataset_splits/` | 2 / 7 | test vs test |
//! | `dyml_vehicle`, `dyml_animal` | `train/label.csv` + `train/imgs/`, `bmk_{fine,middle,coarse}/{query,gallery}.csv` + images | 3 | per scale, query vs gallery |
//! | `dyml_product` | `train/…`, `mini-bmk_all_in_one/label.csv` + `imgs/` | 3 | test vs test |
//! | `cub` | `images.txt`, `image_class_labels.txt`, `classes.txt`, `train_test_split.txt`, `images/` | 1 | second half of the classes |
//! | `vehicleid` | `train_test_split/{train_list,test_list_800,…}.txt`, `image/<7 digits>.jpg` | 1 | Small / Medium / Large |
//!
//! The csv files of DyML keep the distributed files' quirk (the first data row glued to the
//! header), the In-Shop list its image count and padded columns, the real super-class and
//! category folder names are used (`bicycle_final`, `WOMEN/Dresses`, `Plantae`, …), and class
//! ids follow each dataset's convention (1-based for SOP and CUB, `id_00000001` items for
//! In-Shop, iNat category ids from 0). Cars196 (annotations in a MATLAB file) is not written: no
//! paper recipe uses it.
//!
//! **Classes and images.** A [`OnDiskSpec`] gives the number of training and test classes, the
//! images per class and the number of super-classes (level 1; classes are dealt to them in
//! turn, so every super-class gets the same number of classes). Coarser levels (DyML's coarse
//! level, iNat-full's family … kingdom) merge super-classes pairwise, so the labels always form
//! a tree. Training and test classes are disjoint, as in every paper's split. Each image is a
//! small JPEG (`image_size` pixels high, a little wider for some images, so the pipeline's
//! resizes have work to do) whose colour depends on its class and whose stripes depend on its
//! super-class, with per-image noise: a network can learn the classes, and no two images are
//! the same file.
//!
//! **Sizes for a recipe.** [`OnDiskSpec::for_recipe`] sizes a dataset so that the recipe's own
//! sampler forms full batches (at its real batch size): the m-per-class sampler exactly
//! `batches` batches per epoch (`batch_size / m` classes of `m × batches` images); the
//! hierarchical sampler one full batch per pair of super-classes and draw (two super-classes,
//! so `batches_per_super_pair` batches per epoch, or `max_batches`); FastAP's sampler two
//! meta-classes of half a batch each (`batches_per_meta_pair` batches). The test split has 16
//! classes of 4 images unless told otherwise (CUB: as many classes as training, its split being
//! the first half of the classes). [`crate::train::check_recipe`] loads a written dataset through
//! the recipe's loader and sampler and counts the full batches.
//!
//! **Writing.** [`write_dataset`] writes into a temporary folder beside `root` and renames it to
//! `root` when complete, so an interrupted run never leaves a half-written dataset that looks
//! complete; `root` must not exist (or be an empty folder). A `rankwise_synthetic.json` file
//! ([`MARKER_FILE`]) records what was written; [`remove_synthetic`] deletes only folders that
//! carry it, never a real dataset.
//!
//! ```no_run
//! use rankwise::data::synthetic_on_disk::{write_dataset, OnDiskSpec};
//! use rankwise::train::{check_recipe, TrainConfig};
//! let recipe = TrainConfig::from_toml_file("configs/paper/happier_sop.toml")?;
//! let (kind, spec) = OnDiskSpec::for_recipe(&recipe.dataset, &recipe.sampler, 2)?;
//! let written = write_dataset(kind, "/tmp/synthetic/sop".as_ref(), &spec)?;
//! let config = recipe.with_dataset_root(&written.root)?;
//! assert!(check_recipe(&config)?.full_batches >= 1);
//! # Ok::<(), rankwise::Error>(())
//! ```

use super::loaders::dyml::DymlSubset;
use super::loaders::inaturalist::InatHierarchy;
use super::loaders::DatasetConfig;
use crate::error::{Error, Result};
use crate::samplers::SamplerConfig;
use image::codecs::jpeg::JpegEncoder;
use image::{Rgb, RgbImage};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The file in a synthetic dataset's root that records what was written (JSON).
pub const MARKER_FILE: &str = "rankwise_synthetic.json";

/// The largest dataset [`write_dataset`] writes: these datasets are for smoke tests, and a slip
/// in a size (an extra zero) should not fill a disk.
pub const MAX_IMAGES: usize = 200_000;

/// SOP's 12 super-classes, as its folders are named (`<name>_final/`).
const SOP_SUPERS: [&str; 12] = [
    "bicycle",
    "cabinet",
    "chair",
    "coffee_maker",
    "fan",
    "kettle",
    "lamp",
    "mug",
    "sofa",
    "stapler",
    "table",
    "toaster",
];

/// In-Shop's 23 categories (`<GENDER>/<Category>`).
const INSHOP_CATEGORIES: [&str; 23] = [
    "WOMEN/Blouses_Shirts",
    "WOMEN/Cardigans",
    "WOMEN/Denim",
    "WOMEN/Dresses",
    "WOMEN/Graphic_Tees",
    "WOMEN/Jackets_Coats",
    "WOMEN/Leggings",
    "WOMEN/Pants",
    "WOMEN/Rompers_Jumpsuits",
    "WOMEN/Shorts",
    "WOMEN/Skirts",
    "WOMEN/Sweaters",
    "WOMEN/Sweatshirts_Hoodies",
    "WOMEN/Tees_Tanks",
    "MEN/Denim",
    "MEN/Jackets_Vests",
    "MEN/Pants",
    "MEN/Shirts_Polos",
    "MEN/Shorts",
    "MEN/Suiting",
    "MEN/Sweaters",
    "MEN/Sweatshirts_Hoodies",
    "MEN/Tees_Tanks",
];

/// iNaturalist-2018's 14 super-categories (the folders under `train_val2018/`).
const INAT_SUPERS: [&str; 14] = [
    "Actinopterygii",
    "Amphibia",
    "Animalia",
    "Arachnida",
    "Aves",
    "Bacteria",
    "Chromista",
    "Fungi",
    "Insecta",
    "Mammalia",
    "Mollusca",
    "Plantae",
    "Protozoa",
    "Reptilia",
];

/// In-Shop's views: the `<pose>_<view>` part of its file names.
const INSHOP_VIEWS: [&str; 5] = ["1_front", "2_side", "3_back", "4_full", "7_additional"];

/// A dataset format that [`write_dataset`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyntheticKind {
    /// Stanford Online Products.
    Sop,
    /// In-Shop Clothes.
    Inshop,
    /// iNaturalist-2018 read as iNat-base (2 levels).
    InatBase,
    /// iNaturalist-2018 read as iNat-full (7 levels; the same files as `inat_base`).
    InatFull,
    /// DyML-Vehicle.
    DymlVehicle,
    /// DyML-Animal.
    DymlAnimal,
    /// DyML-Product.
    DymlProduct,
    /// CUB-200-2011.
    Cub,
    /// PKU VehicleID.
    #[serde(rename = "vehicleid")]
    VehicleId,
}

impl SyntheticKind {
    /// Every kind.
    pub const ALL: [SyntheticKind; 9] = [
        SyntheticKind::Sop,
        SyntheticKind::Inshop,
        SyntheticKind::InatBase,
        SyntheticKind::InatFull,
        SyntheticKind::DymlVehicle,
        SyntheticKind::DymlAnimal,
        SyntheticKind::DymlProduct,
        SyntheticKind::Cub,
        SyntheticKind::VehicleId,
    ];

    /// The name, as [`DatasetConfig::name`] gives it (`sop`, `inat_full`, `dyml_vehicle`, …).
    pub fn name(self) -> &'static str {
        match self {
            SyntheticKind::Sop => "sop",
            SyntheticKind::Inshop => "inshop",
            SyntheticKind::InatBase => "inat_base",
            SyntheticKind::InatFull => "inat_full",
            SyntheticKind::DymlVehicle => "dyml_vehicle",
            SyntheticKind::DymlAnimal => "dyml_animal",
            SyntheticKind::DymlProduct => "dyml_product",
            SyntheticKind::Cub => "cub",
            SyntheticKind::VehicleId => "vehicleid",
        }
    }

    /// The kind of a recipe's `[dataset]`; errors for the embedded dataset and for Cars196.
    pub fn of(dataset: &DatasetConfig) -> Result<Self> {
        Ok(match dataset {
            DatasetConfig::Sop(_) => SyntheticKind::Sop,
            DatasetConfig::Inshop(_) => SyntheticKind::Inshop,
            DatasetConfig::Inaturalist(d) => match d.hierarchy {
                InatHierarchy::Base => SyntheticKind::InatBase,
                InatHierarchy::Full => SyntheticKind::InatFull,
            },
            DatasetConfig::Dyml(d) => match d.subset {
                DymlSubset::Vehicle => SyntheticKind::DymlVehicle,
                DymlSubset::Animal => SyntheticKind::DymlAnimal,
                DymlSubset::Product => SyntheticKind::DymlProduct,
            },
            DatasetConfig::Cub(_) => SyntheticKind::Cub,
            DatasetConfig::VehicleId(_) => SyntheticKind::VehicleId,
            DatasetConfig::Embedded(_) => {
                return Err(Error::invalid(
                    "dataset.kind",
                    "the embedded dataset is generated in memory; synthetic on-disk datasets \
                     are for recipes that read a dataset from disk",
                ))
            }
            // Cars196 (its annotations are a MATLAB file) and any dataset added without a
            // writer here: a synthetic copy is optional for a dataset.
            other => {
                return Err(Error::invalid(
                    "dataset.kind",
                    format!(
                        "no synthetic writer for `{}`; kinds written: {}",
                        other.name(),
                        kind_names()
                    ),
                ))
            }
        })
    }

    /// Label levels the dataset's loader returns.
    pub fn num_levels(self) -> usize {
        match self {
            SyntheticKind::Cub | SyntheticKind::VehicleId => 1,
            SyntheticKind::Sop | SyntheticKind::Inshop | SyntheticKind::InatBase => 2,
            SyntheticKind::DymlVehicle | SyntheticKind::DymlAnimal | SyntheticKind::DymlProduct => {
                3
            }
            SyntheticKind::InatFull => 7,
        }
    }

    /// The most super-classes the format has names for (SOP 12, In-Shop 23, iNat 14); the
    /// others number them.
    pub fn max_super_classes(self) -> usize {
        match self {
            SyntheticKind::Sop => SOP_SUPERS.len(),
            SyntheticKind::Inshop => INSHOP_CATEGORIES.len(),
            SyntheticKind::InatBase | SyntheticKind::InatFull => INAT_SUPERS.len(),
            _ => usize::MAX,
        }
    }
}

impl fmt::Display for SyntheticKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SyntheticKind {
    type Err = Error;

    /// Parses a [`SyntheticKind::name`].
    fn from_str(s: &str) -> Result<Self> {
        SyntheticKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "kind",
                    format!(
                        "unknown synthetic dataset `{s}`; expected one of {}",
                        kind_names()
                    ),
                )
            })
    }
}

fn kind_names() -> String {
    SyntheticKind::ALL.map(SyntheticKind::name).join(", ")
}

/// The size and look of a synthetic dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDiskSpec {
    /// Training classes (finest level).
    pub train_classes: usize,
    /// Images of each training class.
    pub train_images_per_class: usize,
    /// Test classes (disjoint from the training classes).
    pub test_classes: usize,
    /// Images of each test class, at least 2 (a query needs another image of its class; In-Shop
    /// and DyML make the first image the query and the others the gallery).
    pub test_images_per_class: usize,
    /// Super-classes (level 1) the classes are dealt to in turn; unused by the flat datasets'
    /// labels (CUB, VehicleID), which still draw their stripes from it.
    pub super_classes: usize,
    /// Image height in pixels (widths vary a little above it).
    pub image_size: u32,
    /// Seed of the colours and the noise.
    pub seed: u64,
}

impl Default for OnDiskSpec {
    /// 16 training and 16 test classes of 4 images, 4 super-classes, 64-pixel images.
    fn default() -> Self {
        OnDiskSpec {
            train_classes: 16,
            train_images_per_class: 4,
            test_classes: 16,
            test_images_per_class: 4,
            super_classes: 4,
            image_size: 64,
            seed: 0,
        }
    }
}

impl OnDiskSpec {
    /// Errors naming the first field that `kind` cannot be written with.
    pub fn validate(&self, kind: SyntheticKind) -> Result<()> {
        for (field, value, min) in [
            ("train_classes", self.train_classes, 1),
            ("train_images_per_class", self.train_images_per_class, 1),
            ("test_classes", self.test_classes, 1),
            ("test_images_per_class", self.test_images_per_class, 2),
            ("super_classes", self.super_classes, 1),
        ] {
            if value < min {
                let why = if field == "test_images_per_class" {
                    " (every query needs another image of its class)"
                } else {
                    ""
                };
                return Err(Error::invalid(
                    field,
                    format!("must be ≥ {min}{why}, got {value}"),
                ));
            }
        }
        if self.super_classes > kind.max_super_classes() {
            return Err(Error::invalid(
                "super_classes",
                format!(
                    "{kind} has {} super-classes, got {}",
                    kind.max_super_classes(),
                    self.super_classes
                ),
            ));
        }
        if !(8..=1024).contains(&self.image_size) {
            return Err(Error::invalid(
                "image_size",
                format!("must be within 8..=1024 pixels, got {}", self.image_size),
            ));
        }
        if kind == SyntheticKind::Cub && self.train_classes != self.test_classes {
            return Err(Error::invalid(
                "test_classes",
                format!(
                    "CUB's split is the first half of the classes for training, so test_classes \
                     must equal train_classes ({}), got {}",
                    self.train_classes, self.test_classes
                ),
            ));
        }
        let total = self.num_train_images() + self.num_test_images();
        if total > MAX_IMAGES {
            return Err(Error::invalid(
                "train_classes",
                format!(
                    "{total} images is more than the {MAX_IMAGES} a synthetic dataset may have"
                ),
            ));
        }
        Ok(())
    }

    /// Training images.
    pub fn num_train_images(&self) -> usize {
        self.train_classes
            .saturating_mul(self.train_images_per_class)
    }

    /// Distinct test images (DyML-Vehicle / -Animal write them once per scale).
    pub fn num_test_images(&self) -> usize {
        self.test_classes.saturating_mul(self.test_images_per_class)
    }

    /// A dataset of `kind` on which `sampler` forms full batches at its own batch size (see the
    /// module doc). `batches` is the number of batches per epoch of the m-per-class sampler, the
    /// only one whose epoch length follows the dataset's size (with `batches_per_epoch` set it
    /// draws that many whatever the size). Errors name the sampler field that cannot be served
    /// (a class level other than 0, a super-class level the kind lacks, a batch size that is not
    /// a multiple of what a batch is made of).
    pub fn for_sampler(
        kind: SyntheticKind,
        sampler: &SamplerConfig,
        batches: usize,
    ) -> Result<Self> {
        if batches == 0 {
            return Err(Error::invalid("batches", "must be ≥ 1"));
        }
        let base = OnDiskSpec::default();
        let levels = kind.num_levels();
        let level_1 = |field: &str, class_level: usize, super_level: usize| -> Result<()> {
            if class_level != 0 || super_level != 1 {
                return Err(Error::invalid(
                    format!("sampler.{field}"),
                    format!(
                        "synthetic datasets pair classes of level 0 by super-classes of level 1, \
                         the recipe asks for levels {class_level} and {super_level}"
                    ),
                ));
            }
            if levels < 2 {
                return Err(Error::invalid(
                    format!("sampler.{field}"),
                    format!(
                        "the sampler pairs super-classes (level 1) but {kind} has one label level"
                    ),
                ));
            }
            Ok(())
        };
        let mut spec = match *sampler {
            SamplerConfig::MPerClass {
                batch_size,
                samples_per_class: m,
                level,
                ..
            } => {
                if level != 0 {
                    return Err(Error::invalid(
                        "sampler.level",
                        format!("synthetic datasets are sized for classes of level 0, got {level}"),
                    ));
                }
                let per_batch = whole_multiple(batch_size, m, "samples_per_class")?;
                OnDiskSpec {
                    // Exactly one batch's classes, each with `m` images per batch: every walk of
                    // the Smooth-AP / HAPPIER epoch fills one batch with every class.
                    train_classes: per_batch,
                    train_images_per_class: m.saturating_mul(batches),
                    super_classes: per_batch.min(base.super_classes),
                    ..base
                }
            }
            SamplerConfig::Hierarchical(crate::samplers::HierarchicalConfig {
                batch_size,
                samples_per_class: m,
                super_classes_per_batch: k,
                class_level,
                super_level,
                ..
            }) => {
                level_1("super_level", class_level, super_level)?;
                let unit = k.checked_mul(m).unwrap_or(0);
                let per_part = whole_multiple(
                    batch_size,
                    unit,
                    "super_classes_per_batch × samples_per_class",
                )?;
                // The fewest super-classes the sampler accepts, each with enough classes to fill
                // its part of a batch without repeating a class.
                let supers = k.max(2);
                OnDiskSpec {
                    train_classes: supers * per_part,
                    train_images_per_class: m,
                    super_classes: supers,
                    ..base
                }
            }
            SamplerConfig::FastAp(crate::samplers::FastApConfig {
                batch_size,
                class_level,
                meta_level,
                ..
            }) => {
                level_1("meta_level", class_level, meta_level)?;
                let half = whole_multiple(batch_size, 2, "2")?;
                // Two meta-classes of half a batch each: every batch takes a whole meta-class
                // per half, without wrapping around inside a half.
                let images = base.train_images_per_class;
                let per_meta = half.div_ceil(images);
                OnDiskSpec {
                    train_classes: 2 * per_meta,
                    train_images_per_class: images,
                    super_classes: 2,
                    ..base
                }
            }
        };
        if kind == SyntheticKind::Cub {
            spec.test_classes = spec.train_classes;
        }
        spec.validate(kind)?;
        Ok(spec)
    }

    /// The kind and size of the dataset a recipe needs ([`OnDiskSpec::for_sampler`] with the
    /// recipe's `[dataset]` and `[sampler]`).
    pub fn for_recipe(
        dataset: &DatasetConfig,
        sampler: &SamplerConfig,
        batches: usize,
    ) -> Result<(SyntheticKind, Self)> {
        let kind = SyntheticKind::of(dataset)?;
        Ok((kind, OnDiskSpec::for_sampler(kind, sampler, batches)?))
    }
}

/// `batch_size / unit`, or an error naming `sampler.batch_size` unless it is a positive multiple.
fn whole_multiple(batch_size: usize, unit: usize, unit_name: &str) -> Result<usize> {
    if unit == 0 || batch_size == 0 || !batch_size.is_multiple_of(unit) {
        return Err(Error::invalid(
            "sampler.batch_size",
            format!("must be a positive multiple of {unit_name} = {unit}, got {batch_size}"),
        ));
    }
    Ok(batch_size / unit)
}

/// What [`write_dataset`] wrote (also stored in the root as [`MARKER_FILE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenDataset {
    /// The dataset root: `dataset.root` of a recipe.
    pub root: PathBuf,
    /// The format.
    pub kind: SyntheticKind,
    /// The size it was written with.
    pub spec: OnDiskSpec,
    /// Training images.
    pub train_images: usize,
    /// Test image files (DyML-Vehicle / -Animal: every scale's queries and gallery).
    pub test_images: usize,
    /// Files written (images, lists, the marker excluded).
    pub files: usize,
    /// Bytes written (the marker excluded).
    pub bytes: u64,
}

/// One class of the dataset being written.
#[derive(Debug, Clone, Copy)]
struct Class {
    /// Index over training then test classes: the class's colour and its id in the files.
    index: usize,
    /// Super-class (level 1).
    sup: usize,
    /// Number of images.
    images: usize,
}

impl Class {
    /// Its group at label level `level` ≥ 1: the super-class, then super-classes merged
    /// pairwise at each coarser level (a tree whatever the number of super-classes).
    fn group(&self, level: usize) -> usize {
        self.sup >> (level - 1).min(usize::BITS as usize - 1)
    }
}

/// One image to render: its path under the root and its class.
struct ImageJob {
    rel: String,
    class: Class,
    k: usize,
}

/// Everything a format writes, before it is written.
#[derive(Default)]
struct Layout {
    images: Vec<ImageJob>,
    texts: Vec<(String, String)>,
    train_images: usize,
}

impl Layout {
    fn image(&mut self, rel: String, class: Class, k: usize) {
        self.images.push(ImageJob { rel, class, k });
    }

    fn text(&mut self, rel: &str, content: String) {
        self.texts.push((rel.to_string(), content));
    }
}

/// Writes a synthetic dataset of `kind` and size `spec` into `root` (the folder a recipe's
/// `dataset.root` names), atomically: into a temporary folder beside it, renamed when complete.
/// Errors name `root` when it exists and is not an empty folder, the spec field that `kind`
/// cannot be written with, or the file that could not be written.
pub fn write_dataset(
    kind: SyntheticKind,
    root: &Path,
    spec: &OnDiskSpec,
) -> Result<WrittenDataset> {
    spec.validate(kind)?;
    if root.exists() {
        let empty = root.is_dir()
            && std::fs::read_dir(root)
                .map_err(|e| Error::io(root, e))?
                .next()
                .is_none();
        if !empty {
            return Err(Error::file(
                root,
                "already exists: a synthetic dataset is written into a new (or empty) folder; \
                 remove it first (`rankwise synth-data --force` replaces an earlier synthetic \
                 dataset)",
            ));
        }
    }
    let parent = match root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    let name = root
        .file_name()
        .ok_or_else(|| Error::file(root, "not a folder name"))?
        .to_string_lossy()
        .to_string();
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempdir_in(&parent)
        .map_err(|e| Error::io(&parent, e))?;

    let layout = layout(kind, spec);
    let mut written = WrittenDataset {
        root: root.to_path_buf(),
        kind,
        spec: spec.clone(),
        train_images: layout.train_images,
        test_images: layout.images.len() - layout.train_images,
        files: layout.images.len() + layout.texts.len(),
        bytes: 0,
    };
    let dir = staging.path();
    for (rel, content) in &layout.texts {
        written.bytes += write_file(dir, rel, content.as_bytes())?;
    }
    written.bytes += layout
        .images
        .par_iter()
        .map(|job| {
            let jpeg = encode_jpeg(&render(spec, job.class, job.k))
                .map_err(|e| Error::file(dir.join(&job.rel), format!("cannot encode JPEG: {e}")))?;
            write_file(dir, &job.rel, &jpeg)
        })
        .try_reduce(|| 0, |a, b| Ok(a + b))?;
    let marker = serde_json::to_string_pretty(&written)
        .map_err(|e| Error::invalid("marker", e.to_string()))?;
    write_file(dir, MARKER_FILE, format!("{marker}\n").as_bytes())?;

    // The temporary folder is private (0700); a dataset is read by other users' jobs too.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io(dir, e))?;
    }
    let done = staging.keep();
    // rename(2) replaces an empty folder, and fails (leaving `root` as it was) on a non-empty
    // one created meanwhile.
    if let Err(e) = std::fs::rename(&done, root) {
        let _ = std::fs::remove_dir_all(&done);
        return Err(Error::file(
            root,
            format!(
                "cannot move the written dataset into place from {}: {e}",
                done.display()
            ),
        ));
    }
    Ok(written)
}

/// Deletes a dataset written by [`write_dataset`]; refuses (naming `root`) a folder without
/// [`MARKER_FILE`], so that a real dataset is never deleted. A missing `root` is not an error.
pub fn remove_synthetic(root: &Path) -> Result<()> {
    if !root.exists() {
        return Ok(());
    }
    if !root.join(MARKER_FILE).is_file() {
        return Err(Error::file(
            root,
            format!("not a synthetic dataset (no {MARKER_FILE}): not removing it"),
        ));
    }
    std::fs::remove_dir_all(root).map_err(|e| Error::io(root, e))
}

/// Reads the [`MARKER_FILE`] of a synthetic dataset.
pub fn read_marker(root: &Path) -> Result<WrittenDataset> {
    let path = root.join(MARKER_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(&path, e.to_string()))
}

/// Writes `bytes` to `dir/rel`, creating its folders; returns the number of bytes.
fn write_file(dir: &Path, rel: &str, bytes: &[u8]) -> Result<u64> {
    let path = dir.join(rel);
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(|e| Error::io(p, e))?;
    }
    std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
    Ok(bytes.len() as u64)
}

/// The training and test classes of `spec`: indices 0.. for training, then the test classes;
/// super-classes dealt in turn within each split.
fn classes(spec: &OnDiskSpec) -> (Vec<Class>, Vec<Class>) {
    let train = (0..spec.train_classes)
        .map(|i| Class {
            index: i,
            sup: i % spec.super_classes,
            images: spec.train_images_per_class,
        })
        .collect();
    let test = (0..spec.test_classes)
        .map(|i| Class {
            index: spec.train_classes + i,
            sup: i % spec.super_classes,
            images: spec.test_images_per_class,
        })
        .collect();
    (train, test)
}

/// The files of `kind`.
fn layout(kind: SyntheticKind, spec: &OnDiskSpec) -> Layout {
    let (train, test) = classes(spec);
    let mut out = match kind {
        SyntheticKind::Sop => sop(&train, &test),
        SyntheticKind::Inshop => inshop(&train, &test),
        SyntheticKind::InatBase | SyntheticKind::InatFull => inaturalist(spec, &train, &test),
        SyntheticKind::DymlVehicle | SyntheticKind::DymlAnimal => dyml(&train, &test, false),
        SyntheticKind::DymlProduct => dyml(&train, &test, true),
        SyntheticKind::Cub => cub(&train, &test),
        SyntheticKind::VehicleId => vehicleid(&train, &test),
    };
    out.train_images = spec.num_train_images();
    out
}

/// `Ebay_{train,test}.txt` (`image_id class_id super_class_id path`, ids 1-based and running
/// over both lists) and `<super>_final/<product id>_<k>.JPG`.
fn sop(train: &[Class], test: &[Class]) -> Layout {
    let mut out = Layout::default();
    let mut image_id = 0;
    for (list, classes) in [("Ebay_train.txt", train), ("Ebay_test.txt", test)] {
        let mut text = String::from("image_id class_id super_class_id path\n");
        for c in classes {
            // eBay listing numbers are 12 digits.
            let product = 111_085_122_871u64 + 7_919 * c.index as u64;
            for k in 0..c.images {
                image_id += 1;
                let rel = format!("{}_final/{product}_{k}.JPG", SOP_SUPERS[c.sup]);
                text.push_str(&format!("{image_id} {} {} {rel}\n", c.index + 1, c.sup + 1));
                out.image(rel, *c, k);
            }
        }
        out.text(list, text);
    }
    out
}

/// `Eval/list_eval_partition.txt` (image count, header, padded columns) and
/// `Img/img/<GENDER>/<Category>/id_<8 digits>/<NN>_<pose>_<view>.jpg`; the first image of a
/// test item is its query, the others its gallery.
fn inshop(train: &[Class], test: &[Class]) -> Layout {
    let mut out = Layout::default();
    let mut rows = Vec::new();
    for (classes, is_train) in [(train, true), (test, false)] {
        for c in classes {
            let item = format!("id_{:08}", c.index + 1);
            for k in 0..c.images {
                let name = format!(
                    "img/{}/{item}/{:02}_{}.jpg",
                    INSHOP_CATEGORIES[c.sup],
                    k / INSHOP_VIEWS.len() + 1,
                    INSHOP_VIEWS[k % INSHOP_VIEWS.len()]
                );
                let status = match (is_train, k) {
                    (true, _) => "train",
                    (false, 0) => "query",
                    (false, _) => "gallery",
                };
                rows.push(format!("{name:<60} {item:<16} {status}"));
                out.image(format!("Img/{name}"), *c, k);
            }
        }
    }
    let text = format!(
        "{}\nimage_name item_id evaluation_status\n{}\n",
        rows.len(),
        rows.join("\n")
    );
    out.text("Eval/list_eval_partition.txt", text);
    out
}

/// `train_val2018/<super>/<species>/<hash>.jpg`, the Smooth-AP split files listing them, and the
/// category list twice: in `train2018.json` (with the image and annotation records of the
/// COCO-style file) and as the bare list of `categories.json`.
fn inaturalist(spec: &OnDiskSpec, train: &[Class], test: &[Class]) -> Layout {
    const RANKS: [&str; 6] = ["genus", "family", "order", "class", "phylum", "kingdom"];
    let mut out = Layout::default();
    let mut images = Vec::new();
    let mut annotations = Vec::new();
    for (list, classes) in [
        ("Inat_dataset_splits/Inaturalist_train_set1.txt", train),
        ("Inat_dataset_splits/Inaturalist_test_set1.txt", test),
    ] {
        let mut text = String::new();
        for c in classes {
            for k in 0..c.images {
                let hash = format!(
                    "{:016x}{:016x}",
                    mix(spec.seed, c.index as u64, k as u64, 1),
                    mix(spec.seed, c.index as u64, k as u64, 2)
                );
                let rel = format!(
                    "train_val2018/{}/{}/{hash}.jpg",
                    INAT_SUPERS[c.sup], c.index
                );
                let id = images.len();
                images.push(serde_json::json!({
                    "id": id,
                    "file_name": rel,
                    "width": image_width(spec, k),
                    "height": spec.image_size,
                    "license": 0,
                    "rights_holder": "synthetic",
                }));
                annotations.push(serde_json::json!({
                    "id": id,
                    "image_id": id,
                    "category_id": c.index,
                }));
                text.push_str(&rel);
                text.push('\n');
                out.image(rel, *c, k);
            }
        }
        out.text(list, text);
    }
    let categories: Vec<serde_json::Value> = train
        .iter()
        .chain(test)
        .map(|c| {
            let mut record = serde_json::Map::new();
            record.insert("id".into(), c.index.into());
            record.insert("name".into(), format!("Species {}", c.index).into());
            record.insert("supercategory".into(), INAT_SUPERS[c.sup].into());
            for (r, rank) in RANKS.iter().enumerate() {
                let name = format!("{}{}", capitalise(rank), c.group(r + 1));
                record.insert((*rank).into(), name.into());
            }
            serde_json::Value::Object(record)
        })
        .collect();
    let db = serde_json::json!({
        "info": {"description": "synthetic iNaturalist-2018 layout written by rankwise", "year": 2018},
        "images": images,
        "annotations": annotations,
        "categories": categories,
        "licenses": [{"id": 0, "name": "synthetic", "url": ""}],
    });
    out.text("train2018.json", db.to_string());
    out.text(
        "categories.json",
        serde_json::Value::Array(categories).to_string(),
    );
    out
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// DyML: `train/label.csv` (`fname, coarse_id, middle_id, fine_id`) with `train/imgs/`; the
/// test set per scale (`bmk_<scale>/{query,gallery}.csv`, `fname, labels`, images in
/// `bmk_<scale>/{query,gallery}/`) or, for Product, `mini-bmk_all_in_one/label.csv` with
/// `imgs/`. Every file has its first data row glued to the header, as distributed.
fn dyml(train: &[Class], test: &[Class], product: bool) -> Layout {
    let mut out = Layout::default();
    let mut serial = 0usize;
    let mut three_level = |out: &mut Layout, dir: &str, classes: &[Class]| {
        let mut rows = Vec::new();
        for c in classes {
            for k in 0..c.images {
                let fname = format!("{serial}.jpg");
                serial += 1;
                rows.push(format!(
                    "{fname}, {}, {}, {}",
                    c.group(2),
                    c.group(1),
                    c.index
                ));
                out.image(format!("{dir}/imgs/{fname}"), *c, k);
            }
        }
        out.text(
            &format!("{dir}/label.csv"),
            glued("fname, coarse_id, middle_id, fine_id", &rows),
        );
    };
    three_level(&mut out, "train", train);
    if product {
        three_level(&mut out, "mini-bmk_all_in_one", test);
        return out;
    }
    for (level, scale) in [(0, "fine"), (1, "middle"), (2, "coarse")] {
        let mut query = Vec::new();
        let mut gallery = Vec::new();
        for c in test {
            let label = if level == 0 { c.index } else { c.group(level) };
            for k in 0..c.images {
                let (part, rows) = if k == 0 {
                    ("query", &mut query)
                } else {
                    ("gallery", &mut gallery)
                };
                let fname = format!("{}_{k}.jpg", c.index);
                rows.push(format!("{fname}, {label}"));
                out.image(format!("bmk_{scale}/{part}/{fname}"), *c, k);
            }
        }
        out.text(
            &format!("bmk_{scale}/query.csv"),
            glued("fname, labels", &query),
        );
        out.text(
            &format!("bmk_{scale}/gallery.csv"),
            glued("fname, labels", &gallery),
        );
    }
    out
}

/// A DyML csv: the header with the first row glued to it (no line break), then the other rows.
fn glued(header: &str, rows: &[String]) -> String {
    let mut text = header.to_string();
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            text.push('\n');
        }
        text.push_str(row);
    }
    text.push('\n');
    text
}

/// CUB-200-2011: `classes.txt`, `images.txt`, `image_class_labels.txt`, `train_test_split.txt`
/// (the classification split, unused by the retrieval protocol) and
/// `images/<NNN>.<Name>/<Name>_<NNNN>_<id>.jpg`; class ids 1-based, training classes first.
fn cub(train: &[Class], test: &[Class]) -> Layout {
    let mut out = Layout::default();
    let (mut classes_txt, mut images_txt, mut labels_txt, mut split_txt) =
        (String::new(), String::new(), String::new(), String::new());
    let mut image_id = 0;
    for c in train.iter().chain(test) {
        let id = c.index + 1;
        let folder = format!("{id:03}.Synthetic_Bird_{id}");
        classes_txt.push_str(&format!("{id} {folder}\n"));
        for k in 0..c.images {
            image_id += 1;
            let rel = format!("{folder}/Synthetic_Bird_{id}_{:04}_{image_id}.jpg", k + 1);
            images_txt.push_str(&format!("{image_id} {rel}\n"));
            labels_txt.push_str(&format!("{image_id} {id}\n"));
            split_txt.push_str(&format!("{image_id} {}\n", u8::from(k % 2 == 0)));
            out.image(format!("images/{rel}"), *c, k);
        }
    }
    out.text("classes.txt", classes_txt);
    out.text("images.txt", images_txt);
    out.text("image_class_labels.txt", labels_txt);
    out.text("train_test_split.txt", split_txt);
    out
}

/// PKU VehicleID: `image/<7 digits>.jpg`, `train_test_split/train_list.txt` and the nested
/// `test_list_{800,1600,2400}.txt` (the first third, two thirds and all of the test vehicles, in
/// the 800 : 1,600 : 2,400 ratio of the real sets), lines `<image> <vehicle id>`.
fn vehicleid(train: &[Class], test: &[Class]) -> Layout {
    let mut out = Layout::default();
    let mut serial = 0usize;
    let mut list = |out: &mut Layout, classes: &[Class]| -> Vec<String> {
        let mut lines = Vec::new();
        for c in classes {
            for k in 0..c.images {
                serial += 1;
                let name = format!("{serial:07}");
                lines.push(format!("{name} {}", c.index));
                out.image(format!("image/{name}.jpg"), *c, k);
            }
        }
        lines
    };
    let train_lines = list(&mut out, train);
    out.text(
        "train_test_split/train_list.txt",
        train_lines.join("\n") + "\n",
    );
    let test_lines = list(&mut out, test);
    let per_class = test.first().map_or(1, |c| c.images);
    for (file, thirds) in [
        ("test_list_800.txt", 1),
        ("test_list_1600.txt", 2),
        ("test_list_2400.txt", 3),
    ] {
        let n = (test.len() * thirds).div_ceil(3).max(1) * per_class;
        out.text(
            &format!("train_test_split/{file}"),
            test_lines[..n].join("\n") + "\n",
        );
    }
    out
}

/// SplitMix64 of four words: deterministic colours, noise and file names.
fn mix(seed: u64, a: u64, b: u64, c: u64) -> u64 {
    let mut z = seed
        ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ c.wrapping_mul(0x1656_67B1_9E37_79F9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Image `k`'s width: `image_size`, `+ size/8` or `+ size/4`, so the pipeline's resizes change
/// the aspect ratio of some images.
fn image_width(spec: &OnDiskSpec, k: usize) -> u32 {
    spec.image_size + (k % 3) as u32 * (spec.image_size / 8)
}

/// Image `k` of `class`: a colour of the class (each channel within 48..=207), shifted per image
/// by up to ±24 per channel, stripes whose direction and period depend on the super-class, and
/// per-pixel noise of up to ±32: nearby class colours overlap, so an untrained network does not
/// already rank perfectly and training has something to learn.
fn render(spec: &OnDiskSpec, class: Class, k: usize) -> RgbImage {
    let h = mix(spec.seed, class.index as u64, 0, 0);
    let jitter = mix(spec.seed, class.index as u64, k as u64, u64::MAX);
    let base = [0, 1, 2]
        .map(|i| 48 + ((h >> (16 * i)) % 160) as i32 + ((jitter >> (16 * i)) % 49) as i32 - 24);
    let vertical = class.sup.is_multiple_of(2);
    let period = 3 + (class.sup / 2 % 4) as u32;
    let shift = (k as u32).wrapping_mul(7);
    RgbImage::from_fn(image_width(spec, k), spec.image_size, |x, y| {
        let along = if vertical { x } else { y };
        let stripe = if ((along + shift) / period).is_multiple_of(2) {
            24
        } else {
            -24
        };
        let noise = mix(
            spec.seed,
            class.index as u64,
            k as u64,
            ((y as u64) << 32) | x as u64,
        );
        Rgb([0, 1, 2].map(|i| {
            let n = ((noise >> (8 * i)) % 65) as i32 - 32;
            (base[i] + stripe + n).clamp(0, 255) as u8
        }))
    })
}

/// Encodes `img` as a JPEG of quality 90.
fn encode_jpeg(img: &RgbImage) -> std::result::Result<Vec<u8>, image::ImageError> {
    let mut buf = Vec::new();
    JpegEncoder::new_with_quality(&mut buf, 90).encode_image(img)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in SyntheticKind::ALL {
            assert_eq!(kind.name().parse::<SyntheticKind>().unwrap(), kind);
        }
        let e = "cars".parse::<SyntheticKind>().unwrap_err().to_string();
        assert!(e.contains("cars") && e.contains("dyml_product"), "{e}");
    }

    #[test]
    fn coarser_levels_merge_super_classes_pairwise() {
        let c = Class {
            index: 9,
            sup: 5,
            images: 1,
        };
        assert_eq!(
            (c.group(1), c.group(2), c.group(3), c.group(6)),
            (5, 2, 1, 0)
        );
    }

    #[test]
    fn images_depend_on_class_and_image() {
        let spec = OnDiskSpec {
            image_size: 16,
            ..OnDiskSpec::default()
        };
        let class = |index, sup| Class {
            index,
            sup,
            images: 2,
        };
        let a = render(&spec, class(0, 0), 0);
        assert_eq!(a.dimensions(), (16, 16));
        assert_eq!(render(&spec, class(0, 0), 1).dimensions(), (18, 16));
        assert_eq!(a, render(&spec, class(0, 0), 0));
        assert_ne!(a, render(&spec, class(0, 0), 3));
        let mean = |img: &RgbImage| -> [f64; 3] {
            let n = (img.width() * img.height()) as f64;
            [0, 1, 2].map(|i| img.pixels().map(|p| p.0[i] as f64).sum::<f64>() / n)
        };
        let (m0, m0b, m1) = (
            mean(&a),
            mean(&render(&spec, class(0, 0), 3)),
            mean(&render(&spec, class(1, 0), 0)),
        );
        let dist = |a: [f64; 3], b: [f64; 3]| (0..3).map(|i| (a[i] - b[i]).abs()).sum::<f64>();
        assert!(
            dist(m0, m0b) < 75.0 && dist(m0, m1) > 20.0,
            "{m0:?} {m0b:?} {m1:?}"
        );
    }
}

//! CUB-200-2011 (Wah et al., 2011) and Cars196 (Krause et al., 2013) with the metric-learning
//! split used by RaMBO §1.9 and SSR §3.8: the first half of the classes (by id) for training, the
//! second half for test, every image of a class on its side.
//!
//! * **CUB-200-2011**, root = the unpacked `CUB_200_2011/` folder of `CUB_200_2011.tgz`:
//!   `images.txt` (`<image_id> <relative path>`), `image_class_labels.txt`
//!   (`<image_id> <class_id>`, 1..=200) and `images/`. Train = classes 1–100 (5,864 images), test
//!   = 101–200 (5,924 images). The official `train_test_split.txt` is the *classification* split
//!   and is not used.
//! * **Cars196**, root = the folder holding `cars_annos.mat` and `car_ims/` (from
//!   `car_ims.tgz`): the MAT-file's `annotations` struct array has one element per image with
//!   `relative_im_path` (`car_ims/000001.jpg`) and `class` (1..=196); its `test` flag is the
//!   classification split and is not used. Train = classes 1–98 (8,054 images), test = 99–196
//!   (8,131 images). The MAT-file is read by [`super::matlab`], so no conversion step is needed.
//!
//! ```no_run
//! use rankwise::data::loaders::cub_cars;
//! let cub = cub_cars::load_cub("/data/CUB_200_2011")?;
//! let cars = cub_cars::load_cars("/data/cars196")?;
//! # Ok::<(), rankwise::Error>(())
//! ```

use super::matlab::{read_mat, MatValue};
use super::{
    numbered_lines, parse_field, read_text, require_dir, split_first_half_classes,
    whitespace_fields, TrainTest,
};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Loads CUB-200-2011 and splits it into the first 100 classes (train) and the last 100 (test).
pub fn load_cub(root: impl AsRef<Path>) -> Result<TrainTest> {
    let root = root.as_ref();
    require_dir(root)?;
    let images_txt = root.join("images.txt");
    let labels_txt = root.join("image_class_labels.txt");

    let mut class_of: HashMap<u64, (ClassId, usize)> = HashMap::new();
    let text = read_text(&labels_txt)?;
    for (n, line) in numbered_lines(&text) {
        let f = whitespace_fields(&labels_txt, n, line, &["image_id", "class_id"])?;
        let id: u64 = parse_field(&labels_txt, n, "image_id", f[0])?;
        let class: ClassId = parse_field(&labels_txt, n, "class_id", f[1])?;
        if let Some((_, first)) = class_of.insert(id, (class, n)) {
            return Err(Error::line(
                &labels_txt,
                n,
                format!("image id {id} is already labelled on line {first}"),
            ));
        }
    }

    let text = read_text(&images_txt)?;
    let mut rows = Vec::new();
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (n, line) in numbered_lines(&text) {
        let f = whitespace_fields(&images_txt, n, line, &["image_id", "path"])?;
        let id: u64 = parse_field(&images_txt, n, "image_id", f[0])?;
        if let Some(first) = seen.insert(id, n) {
            return Err(Error::line(
                &images_txt,
                n,
                format!("image id {id} is already listed on line {first}"),
            ));
        }
        let (class, _) = class_of.get(&id).copied().ok_or_else(|| {
            Error::line(
                &images_txt,
                n,
                format!("image id {id} has no class in {}", labels_txt.display()),
            )
        })?;
        rows.push((root.join("images").join(f[1]), class));
    }
    if let Some((id, (_, n))) = class_of.iter().find(|(id, _)| !seen.contains_key(id)) {
        return Err(Error::line(
            &labels_txt,
            *n,
            format!(
                "image id {id} is labelled but not listed in {}",
                images_txt.display()
            ),
        ));
    }
    split_first_half_classes(&images_txt, rows)
}

/// Loads Cars196 from `cars_annos.mat` and splits it into the first 98 classes (train) and the
/// last 98 (test).
pub fn load_cars(root: impl AsRef<Path>) -> Result<TrainTest> {
    let root = root.as_ref();
    require_dir(root)?;
    let mat_path = root.join("cars_annos.mat");
    let mat = read_mat(&mat_path)?;
    let annotations = mat.get("annotations").ok_or_else(|| {
        Error::file(
            &mat_path,
            "no variable 'annotations' (is this the retrieval cars_annos.mat?)",
        )
    })?;
    let MatValue::Struct { items, .. } = annotations else {
        return Err(Error::file(
            &mat_path,
            "'annotations' is not a struct array",
        ));
    };
    let mut rows = Vec::with_capacity(items.len());
    for k in 0..items.len() {
        let bad =
            |what: &str| Error::file(&mat_path, format!("annotation {} (1-based): {what}", k + 1));
        let rel = annotations
            .field(k, "relative_im_path")
            .ok_or_else(|| bad("no field 'relative_im_path'"))?
            .as_string()
            .ok_or_else(|| bad("'relative_im_path' is not a string"))?;
        let class = annotations
            .field(k, "class")
            .ok_or_else(|| bad("no field 'class'"))?
            .as_scalar()
            .ok_or_else(|| bad("'class' is not a scalar"))?;
        if class.fract() != 0.0 || class < 1.0 {
            return Err(bad(&format!(
                "'class' must be a positive integer, got {class}"
            )));
        }
        rows.push((root.join(PathBuf::from(rel)), class as ClassId));
    }
    split_first_half_classes(&mat_path, rows)
}

/// CUB-200-2011 as a recipe names it (`[dataset] kind = "cub"`): the first 100 classes for
/// training, the last 100 for test.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cub {
    /// The unpacked `CUB_200_2011/` folder (`data_scripts/cub.sh`).
    pub root: PathBuf,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

/// Cars196 as a recipe names it (`[dataset] kind = "cars"`): the first 98 classes for training,
/// the last 98 for test.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cars {
    /// The folder holding `cars_annos.mat` and `car_ims/` (`data_scripts/cars196.sh`).
    pub root: PathBuf,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for Cub {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        "cub".into()
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/cub.sh"
    }

    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        TransformPreset::SQUARE_CROPS
    }

    fn load(&self) -> Result<DatasetLists> {
        let d = load_cub(&self.root)?;
        Ok(DatasetLists::within(
            d.train,
            vec![TestLists::within("test", d.test)],
        ))
    }
}

impl DiskDataset for Cars {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        "cars".into()
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/cars196.sh"
    }

    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        TransformPreset::SQUARE_CROPS
    }

    fn load(&self) -> Result<DatasetLists> {
        let d = load_cars(&self.root)?;
        Ok(DatasetLists::within(
            d.train,
            vec![TestLists::within("test", d.test)],
        ))
    }
}

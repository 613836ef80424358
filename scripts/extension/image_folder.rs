//! The example dataset of `scripts/extension_check.sh` (issue #23: adding a dataset touches
//! three files: this loader, its data script `data_scripts/image_folder.sh` and a recipe
//! `configs/image_folder.toml`). torchvision's ImageFolder layout, split by class:
//!
//! ```text
//! <root>/train/<class name>/<image>    <root>/test/<class name>/<image>
//! ```
//!
//! Labels are one level: the index of the class folder in the sorted names of its split (the
//! test classes are other classes, ranked only among themselves). Every test image is a query
//! against the other test images. build.rs finds this file by its `impl DiskDataset`; nothing
//! else names it.

use super::{check_image_file, sorted_entries, DatasetLists, DiskDataset, ImageList, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A class-per-folder dataset as a recipe names it (`[dataset] kind = "imagefolder"`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageFolder {
    /// The folder holding `train/` and `test/` (`data_scripts/image_folder.sh`).
    pub root: PathBuf,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for ImageFolder {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        "image_folder".into()
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/image_folder.sh"
    }

    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        TransformPreset::SQUARE_CROPS
    }

    fn load(&self) -> Result<DatasetLists> {
        let train = load_split(&self.root, "train")?;
        let test = load_split(&self.root, "test")?;
        Ok(DatasetLists::within(
            train,
            vec![TestLists::within("test", test)],
        ))
    }
}

/// Every image of `<root>/<split>/<class>/`, labelled by the class folder's rank.
fn load_split(root: &Path, split: &str) -> Result<ImageList> {
    let dir = root.join(split);
    let mut rows = Vec::new();
    for (id, class) in sorted_entries(&dir)?.into_iter().enumerate() {
        if !class.is_dir() {
            return Err(Error::file(&class, "expected only class folders here"));
        }
        for image in sorted_entries(&class)? {
            check_image_file(&image)?;
            rows.push((image, vec![id as ClassId]));
        }
    }
    ImageList::from_rows(&dir, rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write_png(path: &Path, shade: u8) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::RgbImage::from_pixel(20, 20, image::Rgb([shade, 255 - shade, 64]))
            .save(path)
            .unwrap();
    }

    #[test]
    fn the_recipe_names_it_and_training_reads_it() {
        let root = tempfile::tempdir().unwrap();
        for (split, classes) in [
            ("train", ["a", "b", "c", "d"]),
            ("test", ["e", "f", "g", "h"]),
        ] {
            for (c, class) in classes.iter().enumerate() {
                for k in 0..2 {
                    let path = root.path().join(format!("{split}/{class}/{k}.png"));
                    write_png(&path, (40 * c + k) as u8);
                }
            }
        }
        let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/image_folder.toml");
        let set = format!("dataset.root={}", root.path().display());
        let config = crate::train::load_with_overrides(&recipe, &[set]).unwrap();
        assert_eq!(config.dataset.name(), "image_folder");
        assert_eq!(
            config.dataset.data_script(),
            Some("data_scripts/image_folder.sh")
        );
        let data = crate::train::load_data(&config).unwrap();
        assert_eq!(data.train.len(), 8);
        assert_eq!(data.test.sets().len(), 1);
        assert_eq!(data.test.sets()[0].queries.len(), 8);
        // A missing split names its folder.
        fs::remove_dir_all(root.path().join("test")).unwrap();
        let e = match crate::train::load_data(&config) {
            Ok(_) => panic!("a dataset without its test split must be an error"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("test"), "{e}");
    }
}

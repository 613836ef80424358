//! PKU VehicleID (Liu et al., CVPR 2016), with the Smooth-AP / FastAP protocol (Smooth-AP B.3):
//! 110,178 training images of 13,134 vehicles; three test sets, Small (800 vehicles, 7,332
//! images), Medium (1,600, 12,995) and Large (2,400, 20,038), each evaluated alone with every
//! image a query against the rest of its set.
//!
//! Layout under the root (the `VehicleID_V1.0/` folder):
//! ```text
//! train_test_split/train_list.txt   train_test_split/test_list_{800,1600,2400}.txt
//! image/0000002.jpg  …
//! ```
//! Each list line is `<image name> <vehicle id>`, e.g. `0000002 0`. The image file is
//! `image/<name>.jpg`, the name written on 7 digits as the Smooth-AP code does
//! (`'{:07d}.jpg'.format(int(name))`). Labels are the vehicle ids, flat (one level).

use super::{numbered_lines, parse_field, read_text, require_dir, whitespace_fields, ImageList};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The three VehicleID test sets (a recipe's `test_sizes = ["small", "medium", "large"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestSize {
    /// 800 vehicles (`test_list_800.txt`).
    Small,
    /// 1,600 vehicles (`test_list_1600.txt`).
    Medium,
    /// 2,400 vehicles (`test_list_2400.txt`).
    Large,
}

impl TestSize {
    /// All three, smallest first.
    pub const ALL: [TestSize; 3] = [TestSize::Small, TestSize::Medium, TestSize::Large];

    /// The list file name.
    pub fn file_name(self) -> &'static str {
        match self {
            TestSize::Small => "test_list_800.txt",
            TestSize::Medium => "test_list_1600.txt",
            TestSize::Large => "test_list_2400.txt",
        }
    }
}

/// The training set and the three test sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VehicleIdLists {
    /// Training images.
    pub train: ImageList,
    /// Small, Medium and Large test sets, in that order.
    pub test: [ImageList; 3],
}

/// Loads the training list and the three test lists.
pub fn load(root: impl AsRef<Path>) -> Result<VehicleIdLists> {
    let root = root.as_ref();
    require_dir(root)?;
    Ok(VehicleIdLists {
        train: load_list(root, "train_list.txt")?,
        test: [
            load_list(root, TestSize::Small.file_name())?,
            load_list(root, TestSize::Medium.file_name())?,
            load_list(root, TestSize::Large.file_name())?,
        ],
    })
}

/// Loads one test set.
pub fn load_test(root: impl AsRef<Path>, size: TestSize) -> Result<ImageList> {
    let root = root.as_ref();
    require_dir(root)?;
    load_list(root, size.file_name())
}

/// Reads `train_test_split/<name>`.
fn load_list(root: &Path, name: &str) -> Result<ImageList> {
    let list = root.join("train_test_split").join(name);
    let text = read_text(&list)?;
    let mut rows = Vec::new();
    for (n, line) in numbered_lines(&text) {
        let f = whitespace_fields(&list, n, line, &["image", "vehicle_id"])?;
        let image: u64 = parse_field(&list, n, "image", f[0])?;
        let vehicle: ClassId = parse_field(&list, n, "vehicle_id", f[1])?;
        rows.push((
            root.join("image").join(format!("{image:07}.jpg")),
            vec![vehicle],
        ));
    }
    super::ImageList::from_rows(&list, rows)
}

/// PKU VehicleID as a recipe names it (`[dataset] kind = "vehicleid"`): flat vehicle labels;
/// each of the chosen Small / Medium / Large test sets on its own, every image a query against
/// the rest of its set (`test_small`, `test_medium`, `test_large`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VehicleId {
    /// The `VehicleID_V1.0/` folder (`data_scripts/vehicleid.sh`).
    pub root: PathBuf,
    /// The test sets to evaluate (default all three).
    #[serde(default = "all_sizes")]
    pub test_sizes: Vec<TestSize>,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

fn all_sizes() -> Vec<TestSize> {
    TestSize::ALL.to_vec()
}

impl Default for VehicleId {
    fn default() -> Self {
        VehicleId {
            root: PathBuf::new(),
            test_sizes: all_sizes(),
            images: ImageSettings::default(),
        }
    }
}

impl DiskDataset for VehicleId {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        "vehicleid".into()
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/vehicleid.sh"
    }

    /// The papers' text (Smooth-AP §4.1, RaMBO §5.1): 256 × 256, random / centre 224 crop.
    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        TransformPreset::SQUARE_CROPS
    }

    fn validate_options(&self) -> Result<()> {
        if self.test_sizes.is_empty() {
            return Err(Error::invalid(
                "dataset.test_sizes",
                "list at least one of small, medium, large",
            ));
        }
        Ok(())
    }

    fn load(&self) -> Result<DatasetLists> {
        let d = load(&self.root)?;
        let test = self
            .test_sizes
            .iter()
            .map(|&size| {
                let (split, list) = match size {
                    TestSize::Small => ("test_small", &d.test[0]),
                    TestSize::Medium => ("test_medium", &d.test[1]),
                    TestSize::Large => ("test_large", &d.test[2]),
                };
                TestLists::within(split, list.clone())
            })
            .collect();
        Ok(DatasetLists::within(d.train, test))
    }
}

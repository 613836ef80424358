//! Stanford Online Products (Oh Song et al., CVPR 2016), as distributed in
//! `Stanford_Online_Products.zip`.
//!
//! Layout under the root (the unpacked `Stanford_Online_Products/` folder):
//! ```text
//! Ebay_train.txt   Ebay_test.txt   bicycle_final/…  cabinet_final/…  …
//! ```
//! Each list starts with the header `image_id class_id super_class_id path` and has one
//! whitespace-separated line per image, e.g. `1 1 1 bicycle_final/111085122871_0.JPG`.
//!
//! Labels are `[class_id, super_class_id]` as written in the files (1-based; HAPPIER's code
//! subtracts 1, which changes no metric). The split is the reference one of the files: train
//! 59,551 images / 11,318 classes, test 60,502 images / 11,316 classes, 12 super-classes
//! (Smooth-AP Table 1; HAPPIER supp. A.5).
//!
//! ```no_run
//! let sop = rankwise::data::loaders::sop::load("/data/Stanford_Online_Products")?;
//! assert_eq!(sop.train.len(), 59_551);
//! # Ok::<(), rankwise::Error>(())
//! ```

use super::{
    numbered_lines, parse_field, read_text, require_dir, whitespace_fields, ImageList, TrainTest,
};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Names of the label levels, finest first.
pub const LEVELS: [&str; 2] = ["class", "super_class"];

/// The header line of `Ebay_{train,test}.txt`.
const HEADER: [&str; 4] = ["image_id", "class_id", "super_class_id", "path"];

/// Loads both splits from the dataset root.
pub fn load(root: impl AsRef<Path>) -> Result<TrainTest> {
    let root = root.as_ref();
    require_dir(root)?;
    Ok(TrainTest {
        train: load_list(root, &root.join("Ebay_train.txt"))?,
        test: load_list(root, &root.join("Ebay_test.txt"))?,
    })
}

/// Reads one `Ebay_*.txt` list; image paths are resolved against `root`.
pub fn load_list(root: &Path, list: &Path) -> Result<ImageList> {
    let text = read_text(list)?;
    let mut lines = numbered_lines(&text);
    match lines.next() {
        Some((_, header)) if header.split_whitespace().eq(HEADER.iter().copied()) => {}
        Some((n, header)) => {
            return Err(Error::line(
                list,
                n,
                format!(
                    "expected the header '{}', found '{header}'",
                    HEADER.join(" ")
                ),
            ))
        }
        None => return Err(Error::file(list, "empty file")),
    }
    let mut rows = Vec::new();
    for (n, line) in lines {
        let f = whitespace_fields(list, n, line, &HEADER)?;
        let _image_id: u64 = parse_field(list, n, HEADER[0], f[0])?;
        let class: i64 = parse_field(list, n, HEADER[1], f[1])?;
        let super_class: i64 = parse_field(list, n, HEADER[2], f[2])?;
        rows.push((n, root.join(PathBuf::from(f[3])), vec![class, super_class]));
    }
    ImageList::from_lines(list, rows)
}

/// Stanford Online Products as a recipe names it (`[dataset] kind = "sop"`): labels
/// `[class, super-class]`, every test image a query against the rest.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sop {
    /// The unpacked `Stanford_Online_Products/` folder (`data_scripts/sop.sh`).
    pub root: PathBuf,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for Sop {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        "sop".into()
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/sop.sh"
    }

    /// HAPPIER's (the one paper of the five that trains on SOP with published transforms).
    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        (
            TransformPreset::HappierSopTrain,
            TransformPreset::HappierSopTest,
        )
    }

    fn load(&self) -> Result<DatasetLists> {
        let d = load(&self.root)?;
        Ok(DatasetLists::within(
            d.train,
            vec![TestLists::within("test", d.test)],
        ))
    }
}

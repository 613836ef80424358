//! In-Shop Clothes Retrieval (DeepFashion, Liu et al., CVPR 2016), the RaMBO / FastAP protocol
//! (RaMBO §1.9): 25,882 training images of 3,997 items; 14,218 query and 12,612 gallery images of
//! 3,985 other items, queries retrieved from the gallery.
//!
//! Layout under the root (the "In-shop Clothes Retrieval Benchmark" folder):
//! ```text
//! Eval/list_eval_partition.txt
//! Img/img/WOMEN/Dresses/id_00000002/02_1_front.jpg  …   (Img/img.zip unpacked in Img/)
//! ```
//! A flattened copy with `list_eval_partition.txt` and `img/` directly under the root is also
//! accepted. The list file starts with the number of images, then the header
//! `image_name item_id evaluation_status`, then one line per image:
//! `img/WOMEN/Dresses/id_00000002/02_1_front.jpg id_00000002 train` (status `train`, `query` or
//! `gallery`).
//!
//! Labels are `[item, category]`: the item number of `id_XXXXXXXX`, and the index of
//! `<GENDER>/<Category>` (the path's second and third components; 23 categories such as
//! `MEN/Denim`, used by RaMBO and FastAP to build batches) in the sorted list of categories.

use super::{
    numbered_lines, parse_field, read_text, require_dir, sorted_name_ids, whitespace_fields,
    ImageList, QueryGallery,
};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Names of the label levels, finest first.
pub const LEVELS: [&str; 2] = ["item", "category"];

const HEADER: [&str; 3] = ["image_name", "item_id", "evaluation_status"];

/// The three parts of In-Shop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InShopLists {
    /// Training images.
    pub train: ImageList,
    /// Test queries and gallery.
    pub test: QueryGallery,
}

/// Loads In-Shop from its root (see the module doc for the two accepted layouts).
pub fn load(root: impl AsRef<Path>) -> Result<InShopLists> {
    let root = root.as_ref();
    require_dir(root)?;
    let (list, image_base) = if root.join("Eval/list_eval_partition.txt").is_file() {
        (root.join("Eval/list_eval_partition.txt"), root.join("Img"))
    } else {
        (root.join("list_eval_partition.txt"), root.to_path_buf())
    };
    let text = read_text(&list)?;
    let mut lines = numbered_lines(&text);
    let (n, count) = lines
        .next()
        .ok_or_else(|| Error::file(&list, "empty file"))?;
    let count: usize = parse_field(&list, n, "image count", count)?;
    match lines.next() {
        Some((_, h)) if h.split_whitespace().eq(HEADER.iter().copied()) => {}
        Some((n, h)) => {
            return Err(Error::line(
                &list,
                n,
                format!("expected the header '{}', found '{h}'", HEADER.join(" ")),
            ))
        }
        None => return Err(Error::file(&list, "no header line")),
    }

    struct Row<'a> {
        line: usize,
        path: &'a str,
        item: ClassId,
        category: String,
        status: &'a str,
    }
    let mut rows = Vec::new();
    for (n, line) in lines {
        let f = whitespace_fields(&list, n, line, &HEADER)?;
        let item_digits = f[1].strip_prefix("id_").ok_or_else(|| {
            Error::line(
                &list,
                n,
                format!("item_id must look like 'id_00000002', got '{}'", f[1]),
            )
        })?;
        let item: ClassId = parse_field(&list, n, "item_id", item_digits)?;
        let parts: Vec<&str> = f[0].split('/').collect();
        if parts.len() < 4 {
            return Err(Error::line(
                &list,
                n,
                format!(
                    "image_name must be 'img/<GENDER>/<Category>/<item>/<file>', got '{}'",
                    f[0]
                ),
            ));
        }
        if !matches!(f[2], "train" | "query" | "gallery") {
            return Err(Error::line(
                &list,
                n,
                format!(
                    "evaluation_status must be train, query or gallery, got '{}'",
                    f[2]
                ),
            ));
        }
        rows.push(Row {
            line: n,
            path: f[0],
            item,
            category: format!("{}/{}", parts[1], parts[2]),
            status: f[2],
        });
    }
    if rows.len() != count {
        return Err(Error::line(
            &list,
            n,
            format!(
                "the first line announces {count} images but {} are listed",
                rows.len()
            ),
        ));
    }
    // An item must belong to one category, or [item, category] is not a hierarchy.
    let mut first_seen: HashMap<ClassId, &Row> = HashMap::new();
    for r in &rows {
        let first = *first_seen.entry(r.item).or_insert(r);
        if first.category != r.category {
            return Err(Error::line(
                &list,
                r.line,
                format!(
                    "item id_{:08} is in category {} but line {} puts it in {}",
                    r.item, r.category, first.line, first.category
                ),
            ));
        }
    }
    let categories = sorted_name_ids(rows.iter().map(|r| r.category.as_str()));
    let part = |status: &str| -> Result<ImageList> {
        let picked: Vec<(PathBuf, Vec<ClassId>)> = rows
            .iter()
            .filter(|r| r.status == status)
            .map(|r| {
                (
                    image_base.join(r.path),
                    vec![r.item, categories[&r.category]],
                )
            })
            .collect();
        ImageList::from_rows(&list, picked).map_err(|e| match e {
            Error::File { msg, .. } => Error::file(&list, format!("'{status}' images: {msg}")),
            other => other,
        })
    };
    Ok(InShopLists {
        train: part("train")?,
        test: QueryGallery {
            query: part("query")?,
            gallery: part("gallery")?,
        },
    })
}

/// In-Shop Clothes as a recipe names it (`[dataset] kind = "inshop"`): labels `[item,
/// category]`; the test queries against the gallery.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inshop {
    /// The "In-shop Clothes Retrieval Benchmark" folder (`data_scripts/inshop.sh`).
    pub root: PathBuf,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for Inshop {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        "inshop".into()
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/inshop.sh"
    }

    /// The papers' text (Smooth-AP §4.1, RaMBO §5.1): 256 × 256, random / centre 224 crop.
    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        TransformPreset::SQUARE_CROPS
    }

    fn load(&self) -> Result<DatasetLists> {
        let d = load(&self.root)?;
        let test = TestLists {
            split: "test".into(),
            queries: ("query".into(), d.test.query),
            gallery: Some(("gallery".into(), d.test.gallery)),
        };
        Ok(DatasetLists::within(d.train, vec![test]))
    }
}

//! DyML-Vehicle, DyML-Animal and DyML-Product (Sun et al., "Dynamic Metric Learning", CVPR 2021),
//! as used by HAPPIER (A.5, Table 2): three-level training labels `[fine, middle, coarse]`; for
//! Vehicle and Animal, one query/gallery test set per scale with that scale's labels only; for
//! Product, one test set with all three levels.
//!
//! Layout under a dataset root (`dyml_vehicle/`, `dyml_animal/` or `dyml_product/`):
//! ```text
//! train/label.csv   train/imgs/<fname>
//! bmk_fine/query.csv   bmk_fine/query/<fname>   bmk_fine/gallery.csv   bmk_fine/gallery/<fname>
//! bmk_middle/…   bmk_coarse/…                                  (Vehicle, Animal)
//! mini-bmk_all_in_one/label.csv   mini-bmk_all_in_one/imgs/<fname>            (Product)
//! ```
//! The files are comma-separated with a space after each comma. The three-level files have the
//! columns `fname`, `coarse_id`, `middle_id`, `fine_id`; the per-scale files `fname`, `labels`.
//! Columns are located by name, so their order does not matter.
//!
//! **The glued first row.** In the distributed files the header has no line break before the
//! first data row, e.g. `fname, coarse_id, middle_id, fine_id0.jpg, 2, 17, 301`. pandas therefore
//! reads `0.jpg` into the column name (hence HAPPIER's `" fine_id0.jpg"` and `" labels0.jpg"`
//! columns) and the first image is lost; the DyML authors' loader cuts the header at its last
//! `_id` and keeps that row. This loader recognises a header whose last column name carries extra
//! text and, by default, keeps the glued row ([`GluedRow::Keep`]); [`GluedRow::Drop`] reproduces
//! HAPPIER's pandas reading (one image fewer per file). A header followed by a line break is read
//! normally under both options.

use super::{numbered_lines, parse_field, read_text, require_dir, ImageList, QueryGallery};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Names of the label levels, finest first.
pub const LEVELS: [&str; 3] = ["fine", "middle", "coarse"];

/// What to do with a data row glued to the header line (module doc; a recipe's `glued_row =
/// "keep" | "drop"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GluedRow {
    /// Keep it, as the DyML authors' loader does. Default: every distributed image is loaded.
    #[default]
    Keep,
    /// Drop it, as HAPPIER's `pandas.read_csv` does.
    Drop,
}

/// One test scale of DyML-Vehicle / DyML-Animal: queries and gallery with that scale's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DymlScaleSet {
    /// `"fine"`, `"middle"` or `"coarse"`.
    pub scale: &'static str,
    /// Queries and gallery, one label column each.
    pub sets: QueryGallery,
}

/// Loads `train/label.csv`: labels `[fine, middle, coarse]`.
pub fn load_train(root: impl AsRef<Path>, glued: GluedRow) -> Result<ImageList> {
    let root = root.as_ref();
    require_dir(root)?;
    load_three_level(&root.join("train"), glued)
}

/// Loads the three test scales of DyML-Vehicle or DyML-Animal, fine first.
pub fn load_test_scales(root: impl AsRef<Path>, glued: GluedRow) -> Result<Vec<DymlScaleSet>> {
    let root = root.as_ref();
    require_dir(root)?;
    LEVELS
        .iter()
        .map(|&scale| {
            let dir = root.join(format!("bmk_{scale}"));
            Ok(DymlScaleSet {
                scale,
                sets: QueryGallery {
                    query: load_flat(&dir, "query", glued)?,
                    gallery: load_flat(&dir, "gallery", glued)?,
                },
            })
        })
        .collect()
}

/// Loads DyML-Product's test set `mini-bmk_all_in_one/label.csv`: labels `[fine, middle, coarse]`.
pub fn load_product_test(root: impl AsRef<Path>, glued: GluedRow) -> Result<ImageList> {
    let root = root.as_ref();
    require_dir(root)?;
    load_three_level(&root.join("mini-bmk_all_in_one"), glued)
}

/// `<dir>/label.csv` with images in `<dir>/imgs/`.
fn load_three_level(dir: &Path, glued: GluedRow) -> Result<ImageList> {
    let csv = dir.join("label.csv");
    let table = read_table(&csv, &["fname", "fine_id", "middle_id", "coarse_id"], glued)?;
    let mut rows = Vec::with_capacity(table.len());
    for (n, f) in table {
        let mut row = Vec::with_capacity(3);
        for (k, name) in ["fine_id", "middle_id", "coarse_id"].iter().enumerate() {
            row.push(parse_field::<ClassId>(&csv, n, name, &f[k + 1])?);
        }
        rows.push((n, dir.join("imgs").join(&f[0]), row));
    }
    ImageList::from_lines(&csv, rows)
}

/// `<dir>/<part>.csv` with images in `<dir>/<part>/`, one label column.
fn load_flat(dir: &Path, part: &str, glued: GluedRow) -> Result<ImageList> {
    let csv = dir.join(format!("{part}.csv"));
    let table = read_table(&csv, &["fname", "labels"], glued)?;
    let mut rows = Vec::with_capacity(table.len());
    for (n, f) in table {
        let label: ClassId = parse_field(&csv, n, "labels", &f[1])?;
        rows.push((dir.join(part).join(&f[0]), vec![label]));
    }
    ImageList::from_rows(&csv, rows)
}

/// Reads a DyML csv and returns, per data row, its line number and the fields of the `wanted`
/// columns in that order.
fn read_table(csv: &Path, wanted: &[&str], glued: GluedRow) -> Result<Vec<(usize, Vec<String>)>> {
    let text = read_text(csv)?;
    let mut lines = numbered_lines(&text);
    let (hn, header) = lines.next().ok_or_else(|| Error::file(csv, "empty file"))?;
    let header_fields: Vec<&str> = header.split(',').map(str::trim).collect();
    let parsed = parse_header(&header_fields, wanted).map_err(|msg| Error::line(csv, hn, msg))?;
    let pick = |n: usize, fields: Vec<&str>| -> Result<(usize, Vec<String>)> {
        if fields.len() != parsed.columns {
            return Err(Error::line(
                csv,
                n,
                format!(
                    "expected {} comma-separated fields, found {}",
                    parsed.columns,
                    fields.len()
                ),
            ));
        }
        if fields[parsed.index[0]].is_empty() {
            return Err(Error::line(csv, n, "empty file name"));
        }
        Ok((
            n,
            parsed
                .index
                .iter()
                .map(|&i| fields[i].to_string())
                .collect(),
        ))
    };
    let mut out = Vec::new();
    if let (Some(row), GluedRow::Keep) = (&parsed.glued, glued) {
        out.push(pick(hn, row.iter().map(String::as_str).collect())?);
    }
    for (n, line) in lines {
        out.push(pick(n, line.split(',').map(str::trim).collect())?);
    }
    Ok(out)
}

/// A parsed header: the position of each wanted column, the number of columns, and the data row
/// glued to the header if any.
#[derive(Debug, PartialEq)]
struct Header {
    index: Vec<usize>,
    columns: usize,
    glued: Option<Vec<String>>,
}

/// Locates the `wanted` columns among the trimmed header `fields`, detecting a data row glued to
/// the last column name (`fine_id0.jpg, 2, 17, 301`: the column `fine_id`, then a row starting
/// with `0.jpg`).
fn parse_header(fields: &[&str], wanted: &[&str]) -> std::result::Result<Header, String> {
    let mut names: Vec<&str> = Vec::new();
    let mut glued = None;
    for (i, &f) in fields.iter().enumerate() {
        if wanted.contains(&f) {
            names.push(f);
            continue;
        }
        let Some(&name) = wanted
            .iter()
            .find(|w| f.starts_with(**w) && !names.contains(w))
        else {
            return Err(format!(
                "unexpected column '{f}' (expected the columns {})",
                wanted.join(", ")
            ));
        };
        names.push(name);
        let mut row = vec![f[name.len()..].trim().to_string()];
        row.extend(fields[i + 1..].iter().map(|s| s.to_string()));
        glued = Some(row);
        break;
    }
    let index = wanted
        .iter()
        .map(|w| {
            names
                .iter()
                .position(|n| n == w)
                .ok_or_else(|| format!("missing column '{w}' in the header"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if names.len() != wanted.len() {
        return Err(format!(
            "header has {} columns, expected {} ({})",
            names.len(),
            wanted.len(),
            wanted.join(", ")
        ));
    }
    if let Some(row) = &glued {
        if row.len() != names.len() {
            return Err(format!(
                "the data row glued to the header has {} fields, expected {}",
                row.len(),
                names.len()
            ));
        }
    }
    Ok(Header {
        index,
        columns: names.len(),
        glued,
    })
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

/// DyML-Vehicle, -Animal or -Product as a recipe names it (`[dataset] kind = "dyml"`, `subset`):
/// training labels `[fine, middle, coarse]`; Vehicle and Animal test one query / gallery pair
/// per semantic scale, averaged as HAPPIER Table 2 does; Product every test image a query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dyml {
    /// The `dyml_vehicle/`, `dyml_animal/` or `dyml_product/` folder (`data_scripts/dyml.sh`).
    pub root: PathBuf,
    /// Which of the three.
    pub subset: DymlSubset,
    /// The csv row glued to the header: `keep` (default, the DyML authors' loader) or `drop`
    /// (HAPPIER's pandas reading).
    #[serde(default)]
    pub glued_row: GluedRow,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for Dyml {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        match self.subset {
            DymlSubset::Vehicle => "dyml_vehicle".into(),
            DymlSubset::Animal => "dyml_animal".into(),
            DymlSubset::Product => "dyml_product".into(),
        }
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/dyml.sh"
    }

    /// HAPPIER's.
    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        (
            TransformPreset::HappierInatTrain,
            TransformPreset::RetrievalTest,
        )
    }

    fn load(&self) -> Result<DatasetLists> {
        let train = load_train(&self.root, self.glued_row)?;
        if self.subset == DymlSubset::Product {
            let test = load_product_test(&self.root, self.glued_row)?;
            return Ok(DatasetLists::within(
                train,
                vec![TestLists::within("test", test)],
            ));
        }
        let test = load_test_scales(&self.root, self.glued_row)?
            .into_iter()
            .map(|s| {
                let split = format!("test_{}", s.scale);
                TestLists {
                    queries: (format!("{split} query"), s.sets.query),
                    gallery: Some((format!("{split} gallery"), s.sets.gallery)),
                    split,
                }
            })
            .collect();
        Ok(DatasetLists {
            train,
            test,
            dyml_scales: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE: [&str; 4] = ["fname", "fine_id", "middle_id", "coarse_id"];

    #[test]
    fn plain_header_in_any_order() {
        let h = parse_header(&["fname", "coarse_id", "middle_id", "fine_id"], &THREE).unwrap();
        assert_eq!(h.index, vec![0, 3, 2, 1]);
        assert_eq!(h.glued, None);
    }

    #[test]
    fn glued_row_is_recovered() {
        let f = [
            "fname",
            "coarse_id",
            "middle_id",
            "fine_id0.jpg",
            "2",
            "17",
            "301",
        ];
        let h = parse_header(&f, &THREE).unwrap();
        assert_eq!(h.index, vec![0, 3, 2, 1]);
        assert_eq!(h.columns, 4);
        assert_eq!(
            h.glued,
            Some(vec!["0.jpg".into(), "2".into(), "17".into(), "301".into()])
        );
        let h = parse_header(&["fname", "labels0.jpg", "5"], &["fname", "labels"]).unwrap();
        assert_eq!(h.glued, Some(vec!["0.jpg".into(), "5".into()]));
    }

    #[test]
    fn bad_headers_are_named() {
        assert!(parse_header(&["fname", "class"], &["fname", "labels"])
            .unwrap_err()
            .contains("unexpected column 'class'"));
        assert!(parse_header(&["fname"], &["fname", "labels"])
            .unwrap_err()
            .contains("missing column 'labels'"));
        assert!(
            parse_header(&["fname", "labels0.jpg"], &["fname", "labels"])
                .unwrap_err()
                .contains("glued")
        );
    }
}

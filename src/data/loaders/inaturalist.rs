//! iNaturalist-2018 (Van Horn et al., CVPR 2018) with the retrieval split of Smooth-AP (B.3):
//! 325,846 training images of 5,690 species and 136,093 test images of 2,452 other species, in
//! the two hierarchies of HAPPIER (A.5):
//!
//! * **iNat-base**, 2 levels: `[species, super-category]`, the super-category being the image's
//!   folder under `train_val2018/` (13 of the 14 super-categories occur in the training split).
//! * **iNat-full**, 7 levels: `[species, genus, family, order, class, phylum, kingdom]` from the
//!   taxonomy of the category list.
//!
//! Layout under the root (the HAPPIER / ROADMAP layout):
//! ```text
//! train_val2018/Plantae/7477/3b60c9486db1d2ee875f11a669fbde4a.jpg  …   (train_val2018.tar.gz)
//! train2018.json                                                      (train2018.json.tar.gz)
//! Inat_dataset_splits/Inaturalist_train_set1.txt                      (Smooth-AP split files)
//! Inat_dataset_splits/Inaturalist_test_set1.txt
//! ```
//! Each split line is an image path relative to the root; its parent folder is the category id
//! and the grandparent the super-category. The taxonomy is the `categories` list of
//! `train2018.json` (obfuscated names) or the un-obfuscated `categories.json` the organisers
//! released later (a bare list of the same records); the loader takes `train2018.json` when
//! present, else `categories.json`, or the file named in [`InatConfig::taxonomy_file`]. Names only
//! identify classes, so both give the same labels. iNat-base does not read the taxonomy.
//!
//! **Class ids.** The species id is the iNat category id. A coarser level's id is the index of its
//! key in the sorted list of keys over all 8,142 categories. The key is, by default, the whole
//! lineage down to that rank ([`TaxonKey::Lineage`]), so a genus name used in two families (a
//! hemihomonym such as *Morus*, both a gannet and a mulberry) stays two genera and the labels
//! always form a tree. HAPPIER's code keys each rank by its name alone ([`TaxonKey::Name`]); the
//! two agree unless names repeat, in which case HAPPIER merges the homonyms (and
//! [`crate::hierarchy::Labels`] then rejects the inconsistent tree, naming the class).

use super::TrainTest;
use super::{numbered_lines, parse_field, read_text, require_dir, sorted_name_ids, ImageList};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The taxonomic ranks above species, finest first, as named in the iNat category records.
pub const RANKS: [&str; 6] = ["genus", "family", "order", "class", "phylum", "kingdom"];

/// Which hierarchy to build (a recipe's `hierarchy = "base" | "full"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InatHierarchy {
    /// iNat-base: `[species, super-category]`.
    #[default]
    Base,
    /// iNat-full: `[species, genus, family, order, class, phylum, kingdom]`.
    Full,
}

/// How a taxon above species is identified (module doc; a recipe's `taxon_key = "lineage" |
/// "name"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaxonKey {
    /// By its lineage from the kingdom down (always a tree). Default.
    #[default]
    Lineage,
    /// By its name alone, as HAPPIER's code.
    Name,
}

/// Options of [`load`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InatConfig {
    /// Which hierarchy.
    pub hierarchy: InatHierarchy,
    /// How coarser taxa are keyed (iNat-full only).
    pub taxon_key: TaxonKey,
    /// The category list to read instead of `<root>/train2018.json` / `<root>/categories.json`
    /// (iNat-full only).
    pub taxonomy_file: Option<PathBuf>,
}

impl InatConfig {
    /// iNat-base (2 levels).
    pub fn base() -> Self {
        InatConfig::default()
    }

    /// iNat-full (7 levels).
    pub fn full() -> Self {
        InatConfig {
            hierarchy: InatHierarchy::Full,
            ..InatConfig::default()
        }
    }
}

/// Loads the Smooth-AP train and test splits with the configured hierarchy.
pub fn load(root: impl AsRef<Path>, config: &InatConfig) -> Result<TrainTest> {
    let root = root.as_ref();
    require_dir(root)?;
    let splits = root.join("Inat_dataset_splits");
    let train_list = splits.join("Inaturalist_train_set1.txt");
    let test_list = splits.join("Inaturalist_test_set1.txt");
    let train = read_split(root, &train_list)?;
    let test = read_split(root, &test_list)?;
    match config.hierarchy {
        InatHierarchy::Base => {
            // Same ids on both sides: the sorted super-category names of both splits.
            let supers = sorted_name_ids(
                train
                    .iter()
                    .chain(test.iter())
                    .map(|e| e.super_category.as_str()),
            );
            let rows = |entries: Vec<SplitEntry>| -> Vec<(usize, PathBuf, Vec<ClassId>)> {
                entries
                    .into_iter()
                    .map(|e| {
                        let s = supers[&e.super_category];
                        (e.line, e.path, vec![e.species, s])
                    })
                    .collect()
            };
            Ok(TrainTest {
                train: ImageList::from_lines(&train_list, rows(train))?,
                test: ImageList::from_lines(&test_list, rows(test))?,
            })
        }
        InatHierarchy::Full => {
            let taxonomy_path = match &config.taxonomy_file {
                Some(p) => p.clone(),
                None if root.join("train2018.json").is_file() => root.join("train2018.json"),
                None => root.join("categories.json"),
            };
            let taxonomy = Taxonomy::read(&taxonomy_path, config.taxon_key)?;
            Ok(TrainTest {
                train: taxonomy.labels(&train_list, train)?,
                test: taxonomy.labels(&test_list, test)?,
            })
        }
    }
}

/// One line of a split file.
struct SplitEntry {
    line: usize,
    path: PathBuf,
    species: ClassId,
    super_category: String,
}

/// Reads `Inaturalist_*_set1.txt`: `<…>/<super-category>/<category id>/<file>` per line.
fn read_split(root: &Path, list: &Path) -> Result<Vec<SplitEntry>> {
    let text = read_text(list)?;
    let mut out = Vec::new();
    for (n, line) in numbered_lines(&text) {
        let rel = line.trim();
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.len() < 3 {
            return Err(Error::line(
                list,
                n,
                format!("expected '<super-category>/<category id>/<file>', got '{rel}'"),
            ));
        }
        let species: ClassId = parse_field(list, n, "category id", parts[parts.len() - 2])?;
        out.push(SplitEntry {
            line: n,
            path: root.join(rel),
            species,
            super_category: parts[parts.len() - 3].to_string(),
        });
    }
    Ok(out)
}

/// The category list of `train2018.json`, or the bare list of `categories.json`.
#[derive(Deserialize)]
struct Db {
    categories: Vec<serde_json::Map<String, serde_json::Value>>,
}

/// Species id → class id of each rank above species ([`RANKS`] order).
struct Taxonomy {
    path: PathBuf,
    ranks: BTreeMap<ClassId, [ClassId; 6]>,
}

impl Taxonomy {
    fn read(path: &Path, key: TaxonKey) -> Result<Taxonomy> {
        let text = read_text(path)?;
        let records = if text.trim_start().starts_with('[') {
            serde_json::from_str::<Vec<serde_json::Map<String, serde_json::Value>>>(&text)
        } else {
            serde_json::from_str::<Db>(&text).map(|db| db.categories)
        }
        .map_err(|e| Error::file(path, format!("not an iNat category list: {e}")))?;
        // Lineage strings from the kingdom down, per species: lineage[r] names rank RANKS[r].
        let mut lineages: BTreeMap<ClassId, [String; 6]> = BTreeMap::new();
        for (k, rec) in records.iter().enumerate() {
            let id = rec.get("id").and_then(|v| v.as_i64()).ok_or_else(|| {
                Error::file(path, format!("category record {k} has no integer 'id'"))
            })?;
            let mut names: [String; 6] = Default::default();
            for (r, rank) in RANKS.iter().enumerate() {
                names[r] = match rec.get(*rank) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(serde_json::Value::Number(x)) => x.to_string(),
                    _ => {
                        return Err(Error::file(
                            path,
                            format!(
                                "category {id} has no '{rank}' (iNat-full needs the 2018 category \
                                 records with kingdom … genus)"
                            ),
                        ))
                    }
                };
            }
            let mut keys: [String; 6] = Default::default();
            for r in 0..6 {
                keys[r] = match key {
                    TaxonKey::Name => names[r].clone(),
                    // A separator that cannot occur in names: ranks r..6 from the kingdom down.
                    TaxonKey::Lineage => names[r..]
                        .iter()
                        .rev()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("\u{1f}"),
                };
            }
            if lineages.insert(id, keys).is_some() {
                return Err(Error::file(
                    path,
                    format!("category id {id} is listed twice"),
                ));
            }
        }
        let mut ranks: BTreeMap<ClassId, [ClassId; 6]> =
            lineages.keys().map(|&id| (id, [0; 6])).collect();
        for r in 0..6 {
            let ids = sorted_name_ids(lineages.values().map(|k| k[r].as_str()));
            for (species, keys) in &lineages {
                ranks.get_mut(species).expect("same keys")[r] = ids[&keys[r]];
            }
        }
        Ok(Taxonomy {
            path: path.to_path_buf(),
            ranks,
        })
    }

    /// The 7-level labels of a split.
    fn labels(&self, list: &Path, entries: Vec<SplitEntry>) -> Result<ImageList> {
        let mut rows = Vec::with_capacity(entries.len());
        for e in entries {
            let r = self.ranks.get(&e.species).ok_or_else(|| {
                Error::line(
                    list,
                    e.line,
                    format!("category {} is not in {}", e.species, self.path.display()),
                )
            })?;
            let mut row = Vec::with_capacity(7);
            row.push(e.species);
            row.extend_from_slice(r);
            rows.push((e.line, e.path, row));
        }
        ImageList::from_lines(list, rows)
    }
}

/// iNaturalist-2018 with Smooth-AP's retrieval split as a recipe names it (`[dataset] kind =
/// "inaturalist"`): iNat-base `[species, super-category]` or iNat-full (7 levels), HAPPIER's two
/// hierarchies.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inaturalist {
    /// The folder holding `train_val2018/`, `Inat_dataset_splits/` and the category list
    /// (`data_scripts/inaturalist.sh`).
    pub root: PathBuf,
    /// `base` (2 levels) or `full` (7 levels).
    #[serde(default)]
    pub hierarchy: InatHierarchy,
    /// How iNat-full keys the taxa above species: `lineage` (default, always a tree) or `name`
    /// (HAPPIER's code).
    #[serde(default)]
    pub taxon_key: TaxonKey,
    /// The category list to read instead of `train2018.json` / `categories.json`.
    #[serde(default)]
    pub taxonomy_file: Option<PathBuf>,
    /// Transforms and decoding.
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for Inaturalist {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        match self.hierarchy {
            InatHierarchy::Base => "inat_base".into(),
            InatHierarchy::Full => "inat_full".into(),
        }
    }

    fn data_script(&self) -> &'static str {
        "data_scripts/inaturalist.sh"
    }

    /// HAPPIER's.
    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        (
            TransformPreset::HappierInatTrain,
            TransformPreset::RetrievalTest,
        )
    }

    fn load(&self) -> Result<DatasetLists> {
        let config = InatConfig {
            hierarchy: self.hierarchy,
            taxon_key: self.taxon_key,
            taxonomy_file: self.taxonomy_file.clone(),
        };
        let d = load(&self.root, &config)?;
        Ok(DatasetLists::within(
            d.train,
            vec![TestLists::within("test", d.test)],
        ))
    }
}

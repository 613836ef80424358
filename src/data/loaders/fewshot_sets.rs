//! The few-shot benchmarks of SSR (§3.8): mini-ImageNet (64 / 16 / 20 classes), tiered-ImageNet
//! (351 / 97 / 160) and CIFAR-FS (64 / 16 / 20), as base (meta-training) / validation / novel
//! (test) classes, plus SSR's fixed validation episodes.
//!
//! Three on-disk layouts are read:
//!
//! * **Class folders** ([`load_folders`]) — what SSR's and SIB's download scripts produce for all
//!   three datasets (`Mini-ImageNet/`, `tiered_imagenet/`, `cifar-fs/`):
//!   `train/<class>/<image>`, `val/<class>/<image>`, `test/<class>/<image>`.
//! * **Ravi & Larochelle's csv split** ([`load_ravi_csv`]) for mini-ImageNet:
//!   `train.csv`, `val.csv`, `test.csv` with the header `filename,label` and lines such as
//!   `n0153282900000005.jpg,n01532829`, images in `images/`.
//! * **Class-name lists** ([`load_split_lists`]) for CIFAR-FS (Bertinetto et al.):
//!   `train.txt`, `val.txt`, `test.txt` with one class name per line, images in
//!   `<images>/<class>/` as `get_cifarfs.py` extracts them from CIFAR-100.
//!
//! Classes get the index of their name in the sorted list of all class names of the three parts,
//! so ids are unique across parts. Folder listings are sorted by name (Python's `os.listdir`
//! order, which SSR uses, is arbitrary); hidden entries (a leading `.`) are skipped and any
//! non-image file is an error, so no file is silently dropped or mistaken for an image.

use super::{check_image_file, numbered_lines, read_text, require_dir, sorted_entries};
use super::{sorted_name_ids, ImageList};
use super::{DatasetLists, DiskDataset, TestLists};
use crate::data::dataset::{ImageSettings, TransformPreset};
use crate::error::{Error, Result};
use crate::hierarchy::ClassId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The three class-disjoint parts of a few-shot benchmark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FewShotFiles {
    /// Base (meta-training) classes.
    pub base: ImageList,
    /// Validation classes.
    pub val: ImageList,
    /// Novel (test) classes.
    pub novel: ImageList,
}

/// The parts' folder / file stems, in [`FewShotFiles`] order.
const PARTS: [&str; 3] = ["train", "val", "test"];

/// Loads the class-folder layout: `root/{train,val,test}/<class>/<image>`.
pub fn load_folders(root: impl AsRef<Path>) -> Result<FewShotFiles> {
    let root = root.as_ref();
    require_dir(root)?;
    let mut parts: Vec<Vec<(String, PathBuf)>> = Vec::new();
    for part in PARTS {
        let dir = root.join(part);
        let mut items = Vec::new();
        for class_dir in sorted_entries(&dir)? {
            if !class_dir.is_dir() {
                return Err(Error::file(&class_dir, "expected only class folders here"));
            }
            let class = file_name(&class_dir);
            for image in sorted_entries(&class_dir)? {
                check_image_file(&image)?;
                items.push((class.clone(), image));
            }
        }
        parts.push(items);
    }
    assemble(root, parts)
}

/// Loads Ravi & Larochelle's mini-ImageNet csv split: `root/{train,val,test}.csv`, images in
/// `root/images/`.
pub fn load_ravi_csv(root: impl AsRef<Path>) -> Result<FewShotFiles> {
    let root = root.as_ref();
    require_dir(root)?;
    let mut parts = Vec::new();
    for part in PARTS {
        let csv = root.join(format!("{part}.csv"));
        let text = read_text(&csv)?;
        let mut lines = numbered_lines(&text);
        match lines.next() {
            Some((_, h)) if h.trim() == "filename,label" => {}
            Some((n, h)) => {
                return Err(Error::line(
                    &csv,
                    n,
                    format!("expected the header 'filename,label', found '{h}'"),
                ))
            }
            None => return Err(Error::file(&csv, "empty file")),
        }
        let mut items = Vec::new();
        for (n, line) in lines {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() != 2 || f[0].is_empty() || f[1].is_empty() {
                return Err(Error::line(
                    &csv,
                    n,
                    format!("expected 'filename,label', found '{line}'"),
                ));
            }
            items.push((f[1].to_string(), root.join("images").join(f[0])));
        }
        parts.push(items);
    }
    assemble(root, parts)
}

/// Loads class-name split lists (`splits/{train,val,test}.txt`, one class per line) over an
/// `images/<class>/<image>` folder, the CIFAR-FS layout of Bertinetto et al.
pub fn load_split_lists(
    images: impl AsRef<Path>,
    splits: impl AsRef<Path>,
) -> Result<FewShotFiles> {
    let (images, splits) = (images.as_ref(), splits.as_ref());
    require_dir(images)?;
    require_dir(splits)?;
    let mut parts = Vec::new();
    for part in PARTS {
        let list = splits.join(format!("{part}.txt"));
        let text = read_text(&list)?;
        let mut items = Vec::new();
        for (n, line) in numbered_lines(&text) {
            let class = line.trim();
            let dir = images.join(class);
            if !dir.is_dir() {
                return Err(Error::line(
                    &list,
                    n,
                    format!("class '{class}' has no folder {}", dir.display()),
                ));
            }
            for image in sorted_entries(&dir)? {
                check_image_file(&image)?;
                items.push((class.to_string(), image));
            }
        }
        parts.push(items);
    }
    assemble(splits, parts)
}

/// The images of one fixed episode: `support[c]` and `query[c]` are the files of its `c`-th class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeFiles {
    /// Support images per class.
    pub support: Vec<Vec<PathBuf>>,
    /// Query images per class.
    pub query: Vec<Vec<PathBuf>>,
}

/// Reads SSR's fixed validation episodes (`val1000Episode_5_way_1_shot_15_query.json`: a list of
/// `{"Support": [[path, …], …], "Query": [[path, …], …]}` with paths relative to `image_dir`,
/// the validation folder). Errors unless every episode has the same number of classes, shots and
/// queries (SSR's loader takes them from the first episode).
pub fn load_val_episodes(
    json: impl AsRef<Path>,
    image_dir: impl AsRef<Path>,
) -> Result<Vec<EpisodeFiles>> {
    let (json, image_dir) = (json.as_ref(), image_dir.as_ref());
    #[derive(serde::Deserialize)]
    struct Raw {
        #[serde(rename = "Support")]
        support: Vec<Vec<String>>,
        #[serde(rename = "Query")]
        query: Vec<Vec<String>>,
    }
    let raw: Vec<Raw> = serde_json::from_str(&read_text(json)?)
        .map_err(|e| Error::file(json, format!("not an SSR episode list: {e}")))?;
    let shape = |r: &Raw| {
        (
            r.support.len(),
            r.support.iter().map(Vec::len).collect::<Vec<_>>(),
            r.query.iter().map(Vec::len).collect::<Vec<_>>(),
        )
    };
    let first = raw
        .first()
        .map(shape)
        .ok_or_else(|| Error::file(json, "no episode"))?;
    let resolve = |v: Vec<Vec<String>>| -> Vec<Vec<PathBuf>> {
        v.into_iter()
            .map(|c| c.into_iter().map(|p| image_dir.join(p)).collect())
            .collect()
    };
    raw.into_iter()
        .enumerate()
        .map(|(e, r)| {
            let s = shape(&r);
            if s != first || r.query.len() != first.0 {
                return Err(Error::file(
                    json,
                    format!(
                        "episode {e} has {} classes with {:?} support and {:?} query images; \
                         episode 0 has {} with {:?} and {:?}",
                        s.0, s.1, s.2, first.0, first.1, first.2
                    ),
                ));
            }
            Ok(EpisodeFiles {
                support: resolve(r.support),
                query: resolve(r.query),
            })
        })
        .collect()
}

/// Builds the three parts from `(class name, image)` lists; `source` names the dataset in errors.
fn assemble(source: &Path, parts: Vec<Vec<(String, PathBuf)>>) -> Result<FewShotFiles> {
    let mut part_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (p, items) in parts.iter().enumerate() {
        for (class, _) in items {
            if let Some(&q) = part_of.get(class.as_str()) {
                if q != p {
                    return Err(Error::file(
                        source,
                        format!(
                            "class '{class}' is in both the {} and {} parts",
                            PARTS[q], PARTS[p]
                        ),
                    ));
                }
            }
            part_of.insert(class, p);
        }
    }
    let ids = sorted_name_ids(part_of.keys().copied());
    let mut lists = parts.into_iter().enumerate().map(|(p, items)| {
        let rows: Vec<(PathBuf, Vec<ClassId>)> = items
            .into_iter()
            .map(|(class, path)| (path, vec![ids[&class]]))
            .collect();
        ImageList::from_rows(source, rows).map_err(|e| match e {
            Error::File { path, msg } => Error::file(path, format!("{} part: {msg}", PARTS[p])),
            other => other,
        })
    });
    Ok(FewShotFiles {
        base: lists.next().expect("3 parts")?,
        val: lists.next().expect("3 parts")?,
        novel: lists.next().expect("3 parts")?,
    })
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// SSR's three few-shot benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Benchmark {
    /// mini-ImageNet (64 / 16 / 20 classes, `data_scripts/mini_imagenet.sh`).
    MiniImagenet,
    /// tiered-ImageNet (351 / 97 / 160 classes, `data_scripts/tiered_imagenet.sh`).
    TieredImagenet,
    /// CIFAR-FS (64 / 16 / 20 classes, `data_scripts/cifar_fs.py`).
    CifarFs,
}

/// Which of the three readers above a recipe's few-shot benchmark is read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FewShotLayout {
    /// [`load_folders`]: what the data scripts write for all three benchmarks. Default.
    #[default]
    Folders,
    /// [`load_ravi_csv`] (mini-ImageNet).
    RaviCsv,
    /// [`load_split_lists`] over `<root>/images/` and `<root>/splits/` (CIFAR-FS).
    SplitLists,
}

/// A few-shot benchmark as a recipe names it (`[dataset] kind = "fewshot"`, `benchmark`): the
/// backbone trains on the base classes, as SSR's does before its few-shot episodes; the novel
/// classes are the test set (`test`, every image a query against the other novel images) and
/// the validation classes a second one (`val`). The N-way K-shot episodes of SSR's protocol are
/// drawn from the same files ([`crate::fewshot`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FewShot {
    /// The benchmark's folder (`Mini-ImageNet/`, `tiered_imagenet/`, `cifar-fs/`).
    pub root: PathBuf,
    /// Which benchmark.
    pub benchmark: Benchmark,
    /// How its files are laid out (default: class folders).
    #[serde(default)]
    pub layout: FewShotLayout,
    /// Transforms and decoding; the presets end in a 224 crop, so set `crop_size` to the
    /// benchmark's 84 (ImageNet ones) or 32 (CIFAR-FS).
    #[serde(default)]
    pub images: ImageSettings,
}

impl DiskDataset for FewShot {
    crate::data::loaders::root_and_images!();

    fn name(&self) -> String {
        match self.benchmark {
            Benchmark::MiniImagenet => "mini_imagenet".into(),
            Benchmark::TieredImagenet => "tiered_imagenet".into(),
            Benchmark::CifarFs => "cifar_fs".into(),
        }
    }

    fn data_script(&self) -> &'static str {
        match self.benchmark {
            Benchmark::MiniImagenet => "data_scripts/mini_imagenet.sh",
            Benchmark::TieredImagenet => "data_scripts/tiered_imagenet.sh",
            Benchmark::CifarFs => "data_scripts/cifar_fs.py",
        }
    }

    /// Smooth-AP's retrieval presets (random resized crop + flip; resize + centre crop), the
    /// augmentation of SSR's backbone training, at the recipe's `crop_size`.
    fn default_transforms(&self) -> (TransformPreset, TransformPreset) {
        (
            TransformPreset::RetrievalTrain,
            TransformPreset::RetrievalTest,
        )
    }

    fn load(&self) -> Result<DatasetLists> {
        let files = match self.layout {
            FewShotLayout::Folders => load_folders(&self.root)?,
            FewShotLayout::RaviCsv => load_ravi_csv(&self.root)?,
            FewShotLayout::SplitLists => {
                load_split_lists(self.root.join("images"), self.root.join("splits"))?
            }
        };
        Ok(DatasetLists::within(
            files.base,
            vec![
                TestLists::within("test", files.novel),
                TestLists::within("val", files.val),
            ],
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::data::loaders::DatasetConfig;
    use crate::train::TrainConfig;

    /// A recipe trains on the base classes of a benchmark and tests on its novel and
    /// validation classes, through the dataset registry.
    #[test]
    fn a_recipe_trains_on_the_base_classes() {
        let root = tempfile::tempdir().unwrap();
        for (part, classes) in [("train", 3), ("val", 2), ("test", 2)] {
            for c in 0..classes {
                for k in 0..2 {
                    let path = root.path().join(format!("{part}/{part}{c}/{k}.png"));
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    image::RgbImage::from_pixel(12, 12, image::Rgb([40 * c as u8, 9 * k, 200]))
                        .save(&path)
                        .unwrap();
                }
            }
        }
        let recipe = format!(
            "input_norm = \"imagenet\"\n[dataset]\nkind = \"fewshot\"\nbenchmark = \"cifar_fs\"\n\
             root = {:?}\n[dataset.images]\ncrop_size = 8\n",
            root.path().display().to_string()
        );
        let config: TrainConfig = toml::from_str(&recipe).unwrap();
        assert!(matches!(config.dataset, DatasetConfig::FewShot(_)));
        assert_eq!(config.dataset.name(), "cifar_fs");
        assert_eq!(
            config.dataset.data_script(),
            Some("data_scripts/cifar_fs.py")
        );
        let data = crate::train::load_data(&config).unwrap();
        assert_eq!(data.train.len(), 6);
        let sets = data.test.sets();
        assert_eq!(sets.len(), 2);
        assert_eq!((sets[0].split.as_str(), sets[0].queries.len()), ("test", 4));
        assert_eq!((sets[1].split.as_str(), sets[1].queries.len()), ("val", 4));
        // Class ids are unique across the parts: no novel class shares a base class's id.
        let base: Vec<_> = data.train.labels().column(0);
        let novel: Vec<_> = sets[0].queries.labels().column(0);
        assert!(novel.iter().all(|c| !base.contains(c)));
    }
}

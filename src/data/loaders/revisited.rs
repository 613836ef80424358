//! Revisited Oxford5k and Paris6k (Radenović et al., CVPR 2018), the landmark benchmarks of SSR
//! Table 1, with the ground truth of the `revisitop` project.
//!
//! Layout under the data root (revisitop's `data/datasets/`):
//! ```text
//! roxford5k/gnd_roxford5k.pkl   roxford5k/jpg/all_souls_000000.jpg  …
//! rparis6k/gnd_rparis6k.pkl     rparis6k/jpg/paris_defense_000000.jpg  …
//! ```
//! The ground-truth pickle is a dict with `imlist` (database image names, without extension),
//! `qimlist` (the 70 query image names) and `gnd`, one dict per query with `bbx` (the query
//! region `[x1, y1, x2, y2]`, floats) and `easy`, `hard`, `junk` (0-based indices into `imlist`).
//! Image files are `<dataset>/jpg/<name>.jpg`, as revisitop's `config_imname` /
//! `config_qimname` build them. The pickle is read by [`super::pickle`], which accepts plain
//! lists as well as numpy arrays for these fields.
//!
//! Older revisitop releases ship the same ground truth as `gnd_<dataset>.mat` instead: cell arrays
//! `imlist` and `qimlist`, and a struct array `gnd` whose `easy`, `hard`, `junk` indices are
//! **1-based** (revisitop's `gnd_mat2py` subtracts 1). [`load`] reads the `.pkl` when present,
//! else the `.mat`, and returns 0-based indices either way.

use super::matlab::{read_mat, MatFile, MatValue};
use super::pickle::{read_pickle, PickleValue};
use super::require_dir;
use crate::error::{Error, Result};
use crate::metrics::revisited::GroundTruth;
use std::path::{Path, PathBuf};

/// The two revisited datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Landmarks {
    /// rOxford5k: 4,993 database images, 70 queries.
    Oxford5k,
    /// rParis6k: 6,322 database images, 70 queries.
    Paris6k,
}

impl Landmarks {
    /// revisitop's dataset name (`roxford5k` / `rparis6k`), also the folder name.
    pub fn name(self) -> &'static str {
        match self {
            Landmarks::Oxford5k => "roxford5k",
            Landmarks::Paris6k => "rparis6k",
        }
    }
}

/// A revisited dataset: database and query images, per-query ground truth and query regions.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisitedDataset {
    /// Database images, in `imlist` order (the indices of the ground truth).
    pub database: Vec<PathBuf>,
    /// Query images, in `qimlist` order.
    pub queries: Vec<PathBuf>,
    /// Easy / hard / junk database indices of each query.
    pub ground_truth: Vec<GroundTruth>,
    /// Query region `[x1, y1, x2, y2]` in pixels of the query image (revisitop's `bbx`).
    pub query_boxes: Vec<[f64; 4]>,
}

/// Loads `root/<name>/gnd_<name>.pkl` (or, if absent, `gnd_<name>.mat`) and resolves the image
/// paths.
pub fn load(root: impl AsRef<Path>, which: Landmarks) -> Result<RevisitedDataset> {
    let root = root.as_ref();
    require_dir(root)?;
    let dir = root.join(which.name());
    let pkl = dir.join(format!("gnd_{}.pkl", which.name()));
    let mat = dir.join(format!("gnd_{}.mat", which.name()));
    if pkl.is_file() || !mat.is_file() {
        let cfg = read_pickle(&pkl)?;
        parse_ground_truth(&cfg, &dir.join("jpg")).map_err(|msg| Error::file(&pkl, msg))
    } else {
        let cfg = read_mat(&mat)?;
        parse_ground_truth_mat(&cfg, &dir.join("jpg")).map_err(|msg| Error::file(&mat, msg))
    }
}

/// Interprets the MATLAB ground truth (1-based indices); image paths are `<images>/<name>.jpg`.
pub fn parse_ground_truth_mat(
    cfg: &MatFile,
    images: &Path,
) -> std::result::Result<RevisitedDataset, String> {
    let names = |key: &str| -> std::result::Result<Vec<PathBuf>, String> {
        match cfg.get(key) {
            Some(MatValue::Cell { items, .. }) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_string()
                        .map(|s| images.join(format!("{s}.jpg")))
                        .ok_or_else(|| format!("'{key}'{{{}}} is not a string", i + 1))
                })
                .collect(),
            _ => Err(format!("no cell array '{key}' in the ground truth")),
        }
    };
    let database = names("imlist")?;
    let queries = names("qimlist")?;
    let gnd = cfg
        .get("gnd")
        .ok_or("no struct array 'gnd' in the ground truth")?;
    if !matches!(gnd, MatValue::Struct { .. }) || gnd.len() != queries.len() {
        return Err(format!(
            "'gnd' must be a struct array with one element per query ({} queries)",
            queries.len()
        ));
    }
    let mut ground_truth = Vec::with_capacity(gnd.len());
    let mut query_boxes = Vec::with_capacity(gnd.len());
    for q in 0..gnd.len() {
        let numbers = |key: &str| -> std::result::Result<Vec<f64>, String> {
            match gnd.field(q, key) {
                Some(MatValue::Numeric { data, .. }) => Ok(data.clone()),
                _ => Err(format!(
                    "gnd({})'s '{key}' is missing or not numeric",
                    q + 1
                )),
            }
        };
        let indices = |key: &str| -> std::result::Result<Vec<usize>, String> {
            numbers(key)?
                .into_iter()
                .map(|x| {
                    if x.fract() == 0.0 && x >= 1.0 && (x as usize) <= database.len() {
                        Ok(x as usize - 1)
                    } else {
                        Err(format!(
                            "gnd({})'s '{key}' holds {x}, not a 1-based index of the {} \
                             database images",
                            q + 1,
                            database.len()
                        ))
                    }
                })
                .collect()
        };
        ground_truth.push(GroundTruth {
            easy: indices("easy")?,
            hard: indices("hard")?,
            junk: indices("junk")?,
        });
        let bbx = numbers("bbx")?;
        if bbx.len() != 4 || bbx.iter().any(|c| !c.is_finite()) {
            return Err(format!("gnd({})'s 'bbx' must be 4 finite numbers", q + 1));
        }
        query_boxes.push([bbx[0], bbx[1], bbx[2], bbx[3]]);
    }
    Ok(RevisitedDataset {
        database,
        queries,
        ground_truth,
        query_boxes,
    })
}

/// Interprets the unpickled ground-truth dict; image paths are `<images>/<name>.jpg`.
pub fn parse_ground_truth(
    cfg: &PickleValue,
    images: &Path,
) -> std::result::Result<RevisitedDataset, String> {
    let names = |key: &str| -> std::result::Result<Vec<PathBuf>, String> {
        cfg.get(key)
            .and_then(|v| v.as_list())
            .ok_or_else(|| format!("no list '{key}' in the ground truth"))?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(|s| images.join(format!("{s}.jpg")))
                    .ok_or_else(|| format!("'{key}'[{i}] is not a string"))
            })
            .collect()
    };
    let database = names("imlist")?;
    let queries = names("qimlist")?;
    let gnd = cfg
        .get("gnd")
        .and_then(|v| v.as_list())
        .ok_or("no list 'gnd' in the ground truth")?;
    if gnd.len() != queries.len() {
        return Err(format!(
            "'gnd' has {} entries but 'qimlist' has {} queries",
            gnd.len(),
            queries.len()
        ));
    }
    let mut ground_truth = Vec::with_capacity(gnd.len());
    let mut query_boxes = Vec::with_capacity(gnd.len());
    for (q, g) in gnd.iter().enumerate() {
        let indices = |key: &str| -> std::result::Result<Vec<usize>, String> {
            let list = match g.get(key) {
                Some(v) => v
                    .as_list()
                    .ok_or_else(|| format!("gnd[{q}]['{key}'] is not a list"))?,
                None => return Err(format!("gnd[{q}] has no '{key}'")),
            };
            list.iter()
                .map(|x| match x.as_i64() {
                    Some(i) if i >= 0 && (i as usize) < database.len() => Ok(i as usize),
                    Some(i) => Err(format!(
                        "gnd[{q}]['{key}'] holds index {i}, outside the {} database images",
                        database.len()
                    )),
                    None => Err(format!("gnd[{q}]['{key}'] holds a non-integer")),
                })
                .collect()
        };
        ground_truth.push(GroundTruth {
            easy: indices("easy")?,
            hard: indices("hard")?,
            junk: indices("junk")?,
        });
        let bbx = g
            .get("bbx")
            .and_then(|v| v.as_list())
            .ok_or_else(|| format!("gnd[{q}] has no list 'bbx'"))?;
        let coords: Vec<f64> = bbx.iter().filter_map(|x| x.as_f64()).collect();
        if bbx.len() != 4 || coords.len() != 4 || coords.iter().any(|c| !c.is_finite()) {
            return Err(format!("gnd[{q}]['bbx'] must be 4 finite numbers"));
        }
        query_boxes.push([coords[0], coords[1], coords[2], coords[3]]);
    }
    Ok(RevisitedDataset {
        database,
        queries,
        ground_truth,
        query_boxes,
    })
}

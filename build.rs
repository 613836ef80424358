//! Computes `RANKWISE_RUN_CODE`: a hash of the code a training run depends on, so that the
//! experiments' run cache (`experiments::runs`) never serves a result produced by other code.
//!
//! A run is a resolved recipe handed to the trainer, so its result depends on every source file
//! under `src/` except the modules that never run inside it — `src/experiments/` (which turns
//! table rows into recipes: the resolved recipe is the rest of the cache key), `src/report/`
//! (tables and figures), `src/stats.rs` (the tests behind the verdicts) and `src/bin/` (the
//! CLI, which hands recipes to the library) — and on
//! the exact dependency versions (`Cargo.lock`) and the patched dependencies (`vendor/`). Leaving those folders out lets a change of a
//! caption, a claim or a command-line option reuse the runs; any change of a loss, the trainer,
//! a model, the data or the metrics makes every run new.
//!
//! It also writes the paper registry (`$OUT_DIR/papers.rs`, included by `src/experiments/mod.rs`):
//! every file of `src/experiments/` that defines a `pub const EXPERIMENT` is a paper, declared as
//! a module of that name and listed in `REGISTRY` in the order of its key. Adding a paper is then
//! its experiment file, recipe, published values and notebook, with no line elsewhere.
//!
//! And the dataset registry (`$OUT_DIR/datasets.rs`, included by `src/data/loaders/mod.rs`):
//! every file of `src/data/loaders/` with an `impl DiskDataset for <Type>` is declared as a
//! module, and `DatasetConfig` gets one variant per such type, `kind` = the type's name in lower
//! case. Adding a dataset is then its loader file, its data script and a recipe.
//!
//! Both registries name their files by absolute path, so a target folder shared by two
//! checkouts of the same version holds the registry of whichever built last, and cargo (which
//! reruns this script on `src/` times, not on the checkout's place) may keep it: after building
//! another checkout into this tree's target folder, `touch build.rs`.
//! `scripts/extension_check.sh` builds its copy as another version for that reason.

use std::fs;
use std::path::{Path, PathBuf};

/// Modules of `src/` (folders or files) whose code never runs inside a training run.
const DOWNSTREAM: [&str; 4] = ["experiments", "report", "bin", "stats.rs"];

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut files = Vec::new();
    collect(&root.join("src"), &root, &mut files);
    // The patched candle-core (vendor/candle-core/RANKWISE.md) runs inside every training step.
    if root.join("vendor").is_dir() {
        collect(&root.join("vendor"), &root, &mut files);
    }
    files.sort();
    let lock = root.join("Cargo.lock");
    let mut hash = Fnv::new();
    for rel in &files {
        hash.write(rel.as_bytes());
        hash.write(&[0]);
        hash.write(&fs::read(root.join(rel)).expect("readable source file"));
        hash.write(&[0]);
    }
    // Without a lock file (a crate used from a registry) the versions are whatever resolved.
    if let Ok(bytes) = fs::read(&lock) {
        hash.write(b"Cargo.lock\0");
        hash.write(&bytes);
    }
    println!("cargo:rustc-env=RANKWISE_RUN_CODE={:016x}", hash.0);
    write_paper_registry(&root);
    write_dataset_registry(&root);
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=vendor");
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
}

/// Every file under `dir` (paths relative to `root`, `/`-separated), skipping [`DOWNSTREAM`].
fn collect(dir: &Path, root: &Path, out: &mut Vec<String>) {
    let entries = fs::read_dir(dir).expect("readable source folder");
    for entry in entries {
        let path = entry.expect("readable folder entry").path();
        let rel = path
            .strip_prefix(root)
            .expect("under the root")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        if DOWNSTREAM.iter().any(|d| rel == format!("src/{d}")) {
            continue;
        }
        if path.is_dir() {
            collect(&path, root, out);
        } else {
            out.push(rel);
        }
    }
}

/// The `.rs` files of `dir` other than `mod.rs`: (module name, path, text).
fn modules_in(dir: &Path) -> Vec<(String, PathBuf, String)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("readable folder entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "rs") || stem == "mod" {
            continue;
        }
        let text = fs::read_to_string(&path).expect("readable source file");
        out.push((stem.to_string(), path, text));
    }
    out
}

/// The paper modules of `src/experiments/` (see the crate-level comment), as Rust source.
fn write_paper_registry(root: &Path) {
    let mut papers = Vec::new();
    for (stem, path, text) in modules_in(&root.join("src/experiments")) {
        if text.lines().any(|l| l.starts_with("pub const EXPERIMENT:")) {
            papers.push((stem, path));
        }
    }
    papers.sort();
    let mut out = String::from(
        "// Generated by build.rs: the files of src/experiments/ that define `EXPERIMENT`.\n",
    );
    for (name, path) in &papers {
        let path = path.to_str().expect("a UTF-8 path");
        out.push_str(&format!("#[path = {path:?}]\npub mod {name};\n"));
    }
    let entries: Vec<String> = papers
        .iter()
        .map(|(name, _)| format!("&{name}::EXPERIMENT"))
        .collect();
    out.push_str(&format!(
        "/// Every paper's experiments (the files of `src/experiments/` that define `EXPERIMENT`), \
         in the order of their keys.\npub static REGISTRY: [&dyn crate::experiments::Experiment; {}] = [{}];\n",
        papers.len(),
        entries.join(", ")
    ));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    fs::write(out_dir.join("papers.rs"), out).expect("writable OUT_DIR");
}

/// The dataset modules of `src/data/loaders/` (see the crate-level comment), as Rust source.
fn write_dataset_registry(root: &Path) {
    let mut modules = Vec::new();
    let mut datasets = Vec::new();
    for (stem, path, text) in modules_in(&root.join("src/data/loaders")) {
        let types: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("impl DiskDataset for "))
            .map(|rest| rest.trim_end_matches('{').trim().to_string())
            .collect();
        if !types.is_empty() {
            datasets.extend(types.into_iter().map(|t| (t, stem.clone())));
            modules.push((stem, path));
        }
    }
    modules.sort();
    datasets.sort();
    let mut out = String::from(
        "// Generated by build.rs: the files of src/data/loaders/ with an `impl DiskDataset`.\n",
    );
    for (name, path) in &modules {
        let path = path.to_str().expect("a UTF-8 path");
        out.push_str(&format!("#[path = {path:?}]\npub mod {name};\n"));
    }
    out.push_str(
        "/// Which dataset a recipe trains and evaluates on (`[dataset]`, tagged by `kind`): the \
         embedded dataset, or a dataset on disk (one variant per [`DiskDataset`] of the loader \
         files, `kind` = its type's name in lower case).\n\
         #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]\n\
         #[serde(tag = \"kind\", deny_unknown_fields)]\n\
         pub enum DatasetConfig {\n\
         /// The embedded shapes dataset and its class-disjoint retrieval split, in memory. \
         Default.\n\
         #[serde(rename = \"embedded\")]\nEmbedded(crate::data::EmbeddedConfig),\n",
    );
    for (ty, module) in &datasets {
        let kind = ty.to_lowercase();
        out.push_str(&format!(
            "/// [`{module}::{ty}`].\n#[serde(rename = {kind:?})]\n{ty}({module}::{ty}),\n"
        ));
    }
    out.push_str("}\n\nimpl DatasetConfig {\n");
    for (name, reference) in [("disk", "&"), ("disk_mut", "&mut ")] {
        out.push_str(&format!(
            "/// The dataset on disk; `None` for the embedded dataset.\n\
             pub fn {name}({reference}self) -> Option<{reference}dyn DiskDataset> {{\n\
             match self {{\nDatasetConfig::Embedded(_) => None,\n"
        ));
        for (ty, _) in &datasets {
            out.push_str(&format!("DatasetConfig::{ty}(d) => Some(d),\n"));
        }
        out.push_str("}\n}\n");
    }
    out.push_str(
        "}\n\n/// The embedded dataset with its default settings.\n\
         impl Default for DatasetConfig {\n\
         fn default() -> Self {\n\
         DatasetConfig::Embedded(crate::data::EmbeddedConfig::default())\n\
         }\n\
         }\n",
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    fs::write(out_dir.join("datasets.rs"), out).expect("writable OUT_DIR");
}

/// 64-bit FNV-1a (stable across Rust releases, unlike std's hasher).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

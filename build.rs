//! Computes `RANKWISE_RUN_CODE`: a hash of the code a training run depends on, so that the
//! experiments' run cache (`experiments::runs`) never serves a result produced by other code.
//!
//! A run is a resolved recipe handed to the trainer, so its result depends on every source file
//! under `src/` except the modules that never run inside it — `src/experiments/` (which turns
//! table rows into recipes: the resolved recipe is the rest of the cache key), `src/report/`
//! (tables and figures), `src/stats.rs` (the tests behind the verdicts) and `src/bin/` (the
//! CLI, which hands recipes to the library) — and on
//! the exact dependency versions (`Cargo.lock`). Leaving those folders out lets a change of a
//! caption, a claim or a command-line option reuse the runs; any change of a loss, the trainer,
//! a model, the data or the metrics makes every run new.

use std::fs;
use std::path::{Path, PathBuf};

/// Modules of `src/` (folders or files) whose code never runs inside a training run.
const DOWNSTREAM: [&str; 4] = ["experiments", "report", "bin", "stats.rs"];

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut files = Vec::new();
    collect(&root.join("src"), &root, &mut files);
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
    println!("cargo:rerun-if-changed=src");
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

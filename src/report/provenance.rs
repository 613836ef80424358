//! Where one of our numbers comes from: the data, the scale of the run, and the details a reader
//! needs to judge how comparable it is to the paper's.

use serde::{Deserialize, Serialize};

/// The data and run behind one of our values.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Provenance {
    /// The data that produced it, e.g. `embedded shapes` or `SOP`.
    pub dataset: String,
    /// The scale of the run, as the experiments name it (`tiny`, `quick`, `paper`).
    pub scale: String,
    /// What a reader needs to compare, e.g. `3,840 test queries, small CNN, 5 epochs`.
    pub detail: String,
    /// The seeds of the runs (empty: not a seeded training run, e.g. SSR's episodes).
    pub seeds: Vec<u64>,
    /// The device of the runs (`cpu`, `cuda:0`), empty if not recorded.
    pub device: String,
    /// The hash of the code that trained the runs (`experiments::runs::RUN_CODE`), empty if not
    /// recorded.
    pub code: String,
}

impl Provenance {
    /// A provenance record.
    pub fn new(
        dataset: impl Into<String>,
        scale: impl std::fmt::Display,
        detail: impl Into<String>,
    ) -> Self {
        Provenance {
            dataset: dataset.into(),
            scale: scale.to_string(),
            detail: detail.into(),
            seeds: Vec::new(),
            device: String::new(),
            code: String::new(),
        }
    }

    /// The same provenance with the runs' seeds, device and code hash.
    pub fn with_runs(mut self, seeds: Vec<u64>, device: impl Into<String>, code: &str) -> Self {
        self.seeds = seeds;
        self.device = device.into();
        self.code = code.to_string();
        self
    }

    /// One line for a table caption: `` `quick` scale, embedded shapes: 3,840 test queries ``.
    pub fn describe(&self) -> String {
        let mut out = if self.detail.is_empty() {
            format!("`{}` scale, {}", self.scale, self.dataset)
        } else {
            format!("`{}` scale, {}: {}", self.scale, self.dataset, self.detail)
        };
        let mut runs = Vec::new();
        match self.seeds.as_slice() {
            [] => {}
            [s] => runs.push(format!("seed {s}")),
            seeds => runs.push(format!(
                "{} seeds ({})",
                seeds.len(),
                seeds
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        if !self.device.is_empty() {
            runs.push(format!("device {}", self.device));
        }
        if !self.code.is_empty() {
            runs.push(format!("run code {}", self.code));
        }
        if !runs.is_empty() {
            out.push_str(&format!("; {}", runs.join(", ")));
        }
        out
    }
}

/// What decides a table's numbers: the code, the build, the recipes and the published values
/// the tables compare against. A change to any of these, tracked and uncommitted, makes
/// [`git_commit`] say `-dirty`; the outputs (tables, figures, executed notebooks, the README)
/// do not, since regenerating them is what a reproduction does: before, the second paper of
/// `rankwise reproduce` named `<commit>-dirty` because the first one had rewritten its tables.
pub const PROVENANCE_INPUTS: [&str; 6] = [
    "src",
    "build.rs",
    "Cargo.toml",
    "Cargo.lock",
    "configs",
    "paper_tables/published",
];

/// The commit checked out in the git repository at `root` (12 hex digits), with `-dirty` when
/// tracked files among [`PROVENANCE_INPUTS`] differ from it; `None` when `root` is not a git
/// checkout or git is missing. Tables name it so that a reader can find the code behind them.
pub fn git_commit(root: &std::path::Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut args = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    args.extend(PROVENANCE_INPUTS);
    let dirty = git(&args)?;
    Some(if dirty.is_empty() {
        head
    } else {
        format!("{head}-dirty")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_scale_dataset_and_detail() {
        let p = Provenance::new("embedded shapes", "quick", "small CNN, 5 epochs");
        assert_eq!(
            p.describe(),
            "`quick` scale, embedded shapes: small CNN, 5 epochs"
        );
        let p = Provenance::new("SOP", "paper", "");
        assert_eq!(p.describe(), "`paper` scale, SOP");
        let p = p.with_runs(vec![0, 1, 2], "cuda:0", "00ff");
        assert_eq!(
            p.describe(),
            "`paper` scale, SOP; 3 seeds (0, 1, 2), device cuda:0, run code 00ff"
        );
    }

    #[test]
    fn regenerated_outputs_leave_the_commit_clean_and_changed_inputs_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(root)
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        for (path, text) in [
            ("src/lib.rs", "a"),
            ("configs/fastap.toml", "a"),
            ("paper_tables/published/fastap.csv", "a"),
            ("paper_tables/fastap_quick.csv", "a"),
            ("figures/fastap.svg", "a"),
            ("README.md", "a"),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), text).unwrap();
        }
        git(&["add", "-A"]);
        git(&["commit", "-qm", "init"]);
        let clean = git_commit(root).unwrap();
        assert!(!clean.ends_with("-dirty"), "{clean}");
        // A reproduction rewrites its outputs: still the same, clean commit.
        for path in [
            "paper_tables/fastap_quick.csv",
            "figures/fastap.svg",
            "README.md",
        ] {
            std::fs::write(root.join(path), "b").unwrap();
        }
        assert_eq!(git_commit(root).unwrap(), clean);
        // Any input changed: dirty.
        for path in [
            "src/lib.rs",
            "configs/fastap.toml",
            "paper_tables/published/fastap.csv",
        ] {
            std::fs::write(root.join(path), "b").unwrap();
            assert_eq!(
                git_commit(root).unwrap(),
                format!("{clean}-dirty"),
                "{path}"
            );
            std::fs::write(root.join(path), "a").unwrap();
        }
    }

    #[test]
    fn a_folder_outside_git_has_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(git_commit(dir.path()), None);
    }
}

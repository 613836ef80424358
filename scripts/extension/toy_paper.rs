//! The example paper of `scripts/extension_check.sh` (issue #23: adding a paper touches four
//! files: this module, its recipe `configs/experiments/toy_paper.toml`, its published values
//! `paper_tables/published/toy_paper.csv` and its notebook). Not a paper: one table of two
//! Smooth-AP temperatures and one claim about them, enough to show every part an experiment
//! has. build.rs finds this file because it defines `EXPERIMENT`; nothing else names it.

use super::claim::{row, Claim};
use super::table::{run_tables, Column, Measurements, TableSpec, Variant};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::{smooth_ap::SmoothAp, LossConfig};
use crate::train::TrainConfig;

/// The key of the recipe, the published values and the notebook.
pub const PAPER: &str = "toy_paper";
/// The one table.
pub const TABLE: &str = "Table 1";

fn smooth_ap(tau: f64) -> impl Fn(&mut TrainConfig) {
    move |c| {
        c.loss = LossConfig::SmoothAp(SmoothAp {
            tau,
            ..SmoothAp::default()
        })
    }
}

/// The table: Smooth-AP at τ = 0.01 and τ = 0.1, R@1 and mAP@R.
pub fn tables(_base: &TrainConfig) -> Vec<TableSpec> {
    vec![TableSpec {
        name: TABLE.into(),
        dataset: "Toy".into(),
        variants: vec![
            Variant::with_setting("Smooth-AP", "tau=0.01", smooth_ap(0.01)),
            Variant::with_setting("Smooth-AP", "tau=0.1", smooth_ap(0.1)),
        ],
        columns: vec![Column::same("R@1", Some(0)), Column::same("mAP@R", Some(0))],
    }]
}

/// The example paper's experiments.
pub const EXPERIMENT: super::TrainedPaper = super::TrainedPaper {
    key: PAPER,
    name: "Toy paper",
    measure,
    claims,
    figures,
};

/// Trains both rows at `scale`.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    run_tables(runner, recipe, scale, tables)
}

/// The one claim, decided over the seeds like every other.
pub fn claims(m: &Measurements, _base: &TrainConfig) -> Vec<Claim> {
    vec![Claim::greater(
        "The sharper sigmoid is better: τ = 0.01 beats τ = 0.1 (Table 1, R@1)",
        row("tau=0.01", m.sample(TABLE, "Smooth-AP", "tau=0.01", "R@1")),
        row("tau=0.1", m.sample(TABLE, "Smooth-AP", "tau=0.1", "R@1")),
    )]
}

/// The training curves of both rows.
pub fn figures(m: &Measurements, _tables: &[super::ReproducedTable]) -> Result<Vec<super::Figure>> {
    Ok(vec![super::Figure {
        stem: "toy_paper_training".into(),
        chart: super::publish::training_curves(m, TABLE, "R@1", Some(0), "Toy paper")?,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_registry_lists_it_and_it_reproduces_at_tiny() {
        assert!(super::super::keys().contains(&PAPER));
        assert_eq!(super::super::find("Toy paper").unwrap().key(), PAPER);
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cache = tempfile::tempdir().unwrap();
        let runner = Runner::new(Some(cache.path().to_path_buf()), false);
        let r = super::super::reproduce_paper(PAPER, root, &runner, Scale::Tiny).unwrap();
        assert_eq!(r.tables.len(), 1);
        let both = r.tables[0]
            .comparison
            .rows()
            .iter()
            .filter(|row| row.status == crate::report::Status::Both)
            .count();
        assert!(both > 0, "no cell of ours joined the published values");
        assert_eq!(r.claims.len(), 1);
        assert_eq!(r.figures.len(), 1);
        // The notebook regenerates this paper.
        let notebooks = std::fs::read_dir(root.join("notebooks")).unwrap();
        let found = notebooks.filter_map(|e| e.ok()).any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with("_toy_paper.ipynb")
                && std::fs::read_to_string(e.path())
                    .unwrap()
                    .contains("run_paper_with(\\\"toy_paper\\\"")
        });
        assert!(found, "no notebooks/NN_toy_paper.ipynb running the paper");
    }
}

//! Smooth-AP (Brown et al., ECCV 2020): the SOP comparison (Table 2) and the ablations of τ,
//! the positives per class |P| and the batch size (Table 5).
//!
//! What each row runs at the `quick` and `tiny` scales: every row trains the recipe's network
//! with the row's loss and sampler; the published rows we do not implement (Margin, Divide,
//! MIC, contrastive with a cross-batch memory) are left out, and plain contrastive and triplet
//! rows (no published counterpart in this table) are added for context. The batch sizes of the
//! paper (224/384; 64/128/256 in the ablations) are scaled to the recipe's base batch `B` in the
//! same ratios (`B`, `B·384/224`; `B/2`, `B`, `2B`), noted in each row.

use super::claim::{row, Claim};
use super::table::{
    run_tables, set_batch_size, set_samples_per_class, Column, Measurements, TableSpec, Variant,
};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::{
    contrastive::Contrastive, fastap::FastAp, rambo::RamboConfig, smooth_ap::SmoothAp,
    triplet::Triplet, LossConfig,
};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "smooth_ap";
/// Table 2 (SOP, R@K).
pub const TABLE_MAIN: &str = "Table 2";
/// Table 3, right (iNaturalist, R@K): the same runs, the paper's iNaturalist columns.
pub const TABLE_INAT: &str = "Table 3 right";
/// Table 5, τ ablation (mAP).
pub const TABLE_TAU: &str = "Table 5 tau";
/// Table 5, positives-per-class ablation (mAP).
pub const TABLE_POSITIVES: &str = "Table 5 positives";
/// Table 5, batch-size ablation (mAP).
pub const TABLE_BATCH: &str = "Table 5 batch";
/// The paper's dataset column our Table 5 values stand beside.
pub const ABLATION_DATASET: &str = "VGGFace2-Test";

fn smooth_ap(tau: f64) -> LossConfig {
    LossConfig::SmoothAp(SmoothAp {
        tau,
        ..SmoothAp::default()
    })
}

/// `b · num / den` rounded to the nearest multiple of `m` (at least `m`).
fn scaled_batch(b: usize, num: usize, den: usize, m: usize) -> usize {
    let target = b as f64 * num as f64 / den as f64;
    ((target / m as f64).round() as usize).max(1) * m
}

fn samples_per_class(config: &crate::train::TrainConfig) -> usize {
    match &config.sampler {
        crate::train::SamplerConfig::MPerClass {
            samples_per_class, ..
        } => *samples_per_class,
        _ => 1,
    }
}

/// The rows of the method comparison (Tables 2 and 3): our batch `b` stands for the paper's
/// 224 and `big` (same ratio) for 384.
fn comparison_rows(b: usize, big: usize) -> Vec<Variant> {
    vec![
        Variant::new("FastAP [5]", |c| {
            c.loss = LossConfig::FastAp(FastAp::default())
        })
        .note(format!("ours: batch {b}")),
        Variant::new("Blackbox AP [54]", |c| {
            c.loss = LossConfig::Rambo(RamboConfig::default())
        })
        .note(format!("ours: RaMBO log log, batch {b}")),
        Variant::with_setting("Smooth-AP", "batch=224", |c| c.loss = smooth_ap(0.01))
            .note(format!("ours: batch {b}")),
        Variant::with_setting("Smooth-AP", "batch=384", move |c| {
            c.loss = smooth_ap(0.01);
            set_batch_size(c, big);
        })
        .note(format!("ours: batch {big}")),
        Variant::new("Contrastive (ours, no memory)", |c| {
            c.loss = LossConfig::Contrastive(Contrastive::default())
        }),
        Variant::new("Triplet Semi-Hard [74]", |c| {
            c.loss = LossConfig::Triplet(Triplet::default())
        }),
    ]
}

/// Smooth-AP's experiments ([`super::Experiment`]): every row a training run of the recipe.
pub const EXPERIMENT: super::TrainedPaper = super::TrainedPaper {
    key: PAPER,
    name: "Smooth-AP",
    measure,
    claims: |m, _| claims(m),
    figures,
};

/// The tables' rows and columns for a base recipe.
pub fn tables(base: &crate::train::TrainConfig) -> Vec<TableSpec> {
    let b = base.sampler.batch_size();
    let m = samples_per_class(base);
    let big = scaled_batch(b, 384, 224, m);
    let recall = |ks: [&'static str; 4]| ks.map(|k| Column::same(k, Some(0))).to_vec();
    let tau = [0.1, 0.01, 0.001]
        .map(|tau| {
            Variant::with_setting("Smooth-AP", format!("tau={tau}"), move |c| {
                c.loss = smooth_ap(tau)
            })
        })
        .into();
    let positives = [4, 8, 16]
        .map(|p| {
            Variant::with_setting("Smooth-AP", format!("positives={p}"), move |c| {
                c.loss = smooth_ap(0.01);
                set_samples_per_class(c, p);
            })
            .note(format!("ours: batch {b}"))
        })
        .into();
    let batches = [(64, b / 2), (128, b), (256, 2 * b)]
        .map(|(paper_b, ours)| {
            Variant::with_setting("Smooth-AP", format!("batch={paper_b}"), move |c| {
                c.loss = smooth_ap(0.01);
                set_batch_size(c, ours);
            })
            .note(format!("ours: batch {ours}"))
        })
        .into();
    let map = || vec![Column::same("mAP", Some(0))];
    let spec = |name: &str, dataset: &str, variants, columns| TableSpec {
        name: name.into(),
        dataset: dataset.into(),
        variants,
        columns,
    };
    vec![
        spec(
            TABLE_MAIN,
            "SOP",
            comparison_rows(b, big),
            recall(["R@1", "R@10", "R@100", "R@1000"]),
        ),
        spec(
            TABLE_INAT,
            "iNaturalist",
            // One set of runs fills both tables' columns: say so where a reader looks.
            comparison_rows(b, big)
                .into_iter()
                .map(|v| v.and_note("the same runs as Table 2"))
                .collect(),
            recall(["R@1", "R@4", "R@16", "R@32"]),
        ),
        spec(TABLE_TAU, ABLATION_DATASET, tau, map()),
        spec(TABLE_POSITIVES, ABLATION_DATASET, positives, map()),
        spec(TABLE_BATCH, ABLATION_DATASET, batches, map()),
    ]
}

/// Trains every row of Tables 2 and 5 at `scale` (every seed) and returns our cells.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    run_tables(runner, recipe, scale, tables)
}

/// The paper's claims as it states them (Sec. 5.2–5.4, Tables 2 and 5), checked on our
/// measurements. Table 3's iNaturalist columns are the same runs as Table 2 here, so they add
/// no claim of their own.
pub fn claims(m: &Measurements) -> Vec<Claim> {
    let main =
        |method: &str, setting: &str, metric: &str| m.sample(TABLE_MAIN, method, setting, metric);
    let ab =
        |table: &str, setting: &str| row(setting, m.sample(table, "Smooth-AP", setting, "mAP"));
    let recalls = ["R@1", "R@10", "R@100", "R@1000"];
    vec![
        Claim::on_each(
            "Smooth-AP outperforms the prior methods at the same batch (FastAP, Blackbox AP, \
             Triplet Semi-Hard) at every R@K (Table 2, SOP: R@1, 10, 100, 1000)",
            &recalls,
            |k| {
                Claim::greater_all(
                    "",
                    row("Smooth-AP", main("Smooth-AP", "batch=224", k)),
                    &[
                        row("FastAP", main("FastAP [5]", "", k)),
                        row("Blackbox AP", main("Blackbox AP [54]", "", k)),
                        row("Triplet SH", main("Triplet Semi-Hard [74]", "", k)),
                    ],
                )
            },
        ),
        Claim::on_each(
            "A larger batch improves Smooth-AP at every R@K (Table 2: BS 384 > BS 224)",
            &recalls,
            |k| {
                Claim::greater(
                    "",
                    row("batch 384", main("Smooth-AP", "batch=384", k)),
                    row("batch 224", main("Smooth-AP", "batch=224", k)),
                )
            },
        ),
        Claim::best_of(
            "τ = 0.01 is the best temperature of 0.1, 0.01 and 0.001 (Table 5, mAP)",
            "tau=0.01",
            &["tau=0.1", "tau=0.01", "tau=0.001"].map(|s| ab(TABLE_TAU, s)),
        ),
        Claim::best_of(
            "Few positives per class is best: |P| = 4 beats 8 and 16 (Table 5, mAP)",
            "positives=4",
            &["positives=4", "positives=8", "positives=16"].map(|s| ab(TABLE_POSITIVES, s)),
        ),
        Claim::increasing(
            "A larger batch is better: mAP rises from 64 to 128 to 256 (Table 5; ours ½, 1, 2× \
             the base batch)",
            &["batch=64", "batch=128", "batch=256"].map(|s| ab(TABLE_BATCH, s)),
        ),
    ]
}

/// The figures: the τ, |P| and batch-size ablations (ours; the paper's values are face-retrieval
/// mAPs near 0.9, printed in the tables, and would flatten our curves on a shared axis) and the
/// test R@1 of Table 2's methods over training.
pub fn figures(m: &Measurements, tables: &[super::ReproducedTable]) -> Result<Vec<super::Figure>> {
    use super::publish::{sweep_of, training_curves};
    use crate::report::sweep;
    let ours_only = |table: &str, key: &str| -> Result<crate::report::Sweep> {
        let mut s = sweep_of(tables, table, "mAP", ABLATION_DATASET, key)?;
        s.paper.clear();
        s.name = "mAP".into();
        Ok(s)
    };
    let fig = |stem: &str, chart| super::Figure {
        stem: stem.into(),
        chart,
    };
    Ok(vec![
        fig(
            "smooth_ap_tau",
            sweep(
                "Smooth-AP Table 5: temperature τ (ours)",
                "τ",
                "mAP",
                &[ours_only(TABLE_TAU, "tau")?],
                true,
            )?,
        ),
        fig(
            "smooth_ap_positives",
            sweep(
                "Smooth-AP Table 5: positives per class |P| (ours)",
                "|P|",
                "mAP",
                &[ours_only(TABLE_POSITIVES, "positives")?],
                false,
            )?,
        ),
        fig(
            "smooth_ap_batch",
            sweep(
                "Smooth-AP Table 5: batch size (paper's; ours scaled ½, 1, 2×)",
                "batch size (paper)",
                "mAP",
                &[ours_only(TABLE_BATCH, "batch")?],
                true,
            )?,
        ),
        fig(
            "smooth_ap_training",
            training_curves(
                m,
                TABLE_MAIN,
                "R@1",
                Some(0),
                "Smooth-AP Table 2 methods: test R@1 during training",
            )?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_scale_in_the_papers_ratio() {
        assert_eq!(scaled_batch(64, 384, 224, 4), 108);
        assert_eq!(scaled_batch(224, 384, 224, 4), 384);
        assert_eq!(scaled_batch(8, 384, 224, 2), 14);
        assert_eq!(scaled_batch(1, 1, 10, 4), 4);
    }
}

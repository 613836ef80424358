//! Smooth-AP (Brown et al., ECCV 2020): the SOP comparison (Table 2) and the ablations of τ,
//! the positives per class |P| and the batch size (Table 5).
//!
//! What each row runs at the `quick` and `tiny` scales: every row trains the recipe's network
//! with the row's loss and sampler; the published rows we do not implement (Margin, Divide,
//! MIC, contrastive with a cross-batch memory) are left out, and plain contrastive and triplet
//! rows (no published counterpart in this table) are added for context. The batch sizes of the
//! paper (224/384; 64/128/256 in the ablations) are scaled to the recipe's base batch `B` in the
//! same ratios (`B`, `B·384/224`; `B/2`, `B`, `2B`), noted in each row.

use super::table::{
    batch_size, dataset_name, run_tables, set_batch_size, set_samples_per_class, Column,
    Measurements, TableSpec, Unit, Variant,
};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::config::{
    ContrastiveConfig, FastApConfig, LossConfig, RamboConfig, SmoothApConfig, TripletConfig,
};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "smooth_ap";
/// Table 2 (SOP, R@K).
pub const TABLE_MAIN: &str = "Smooth-AP Table 2";
/// Table 5 (ablations of τ, |P| and the batch size, mAP).
pub const TABLE_ABLATION: &str = "Smooth-AP Table 5";

fn smooth_ap(tau: f64) -> LossConfig {
    LossConfig::SmoothAp(SmoothApConfig {
        tau,
        ..SmoothApConfig::default()
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

/// The tables' rows and columns for a base recipe.
pub fn tables(base: &crate::train::TrainConfig) -> Vec<TableSpec> {
    let b = batch_size(base);
    let m = samples_per_class(base);
    let big = scaled_batch(b, 384, 224, m);
    let recall = vec![
        Column::same("R@1", Some(0)),
        Column::same("R@10", Some(0)),
        Column::same("R@100", Some(0)),
        Column::same("R@1000", Some(0)),
    ];
    let main = vec![
        Variant::new("FastAP [5]", |c| {
            c.loss = LossConfig::FastAp(FastApConfig::default())
        })
        .note(format!("ours: batch {b}")),
        Variant::new("Blackbox AP [54]", |c| {
            c.loss = LossConfig::Rambo(RamboConfig::default())
        })
        .note(format!("ours: RaMBO log log, batch {b}")),
        Variant::new("Smooth-AP BS=224", |c| c.loss = smooth_ap(0.01))
            .note(format!("ours: batch {b}")),
        Variant::new("Smooth-AP BS=384", move |c| {
            c.loss = smooth_ap(0.01);
            set_batch_size(c, big);
        })
        .note(format!("ours: batch {big}")),
        Variant::new("Contrastive (ours, no memory)", |c| {
            c.loss = LossConfig::Contrastive(ContrastiveConfig::default())
        }),
        Variant::new("Triplet SH (ours)", |c| {
            c.loss = LossConfig::Triplet(TripletConfig::default())
        }),
    ];
    let mut ablation = Vec::new();
    for tau in [0.1, 0.01, 0.001] {
        ablation.push(Variant::with_setting(
            "Smooth-AP",
            format!("tau={tau}"),
            move |c| c.loss = smooth_ap(tau),
        ));
    }
    for p in [4, 8, 16] {
        ablation.push(
            Variant::with_setting("Smooth-AP", format!("P={p}"), move |c| {
                c.loss = smooth_ap(0.01);
                set_samples_per_class(c, p);
            })
            .note(format!("ours: batch {b}")),
        );
    }
    for (paper_b, ours) in [(64, b / 2), (128, b), (256, 2 * b)] {
        ablation.push(
            Variant::with_setting("Smooth-AP", format!("batch={paper_b}"), move |c| {
                c.loss = smooth_ap(0.01);
                set_batch_size(c, ours);
            })
            .note(format!("ours: batch {ours}")),
        );
    }
    vec![
        TableSpec {
            name: TABLE_MAIN.into(),
            variants: main,
            columns: recall,
            unit: Unit::Percent,
        },
        TableSpec {
            name: TABLE_ABLATION.into(),
            variants: ablation,
            columns: vec![Column::same("mAP", Some(0))],
            unit: Unit::Fraction,
        },
    ]
}

/// Trains every row of Tables 2 and 5 at `scale` and returns our cells.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    let base = recipe.base(scale)?;
    run_tables(runner, &base, &dataset_name(scale), &tables(&base))
}

/// The paper's qualitative claims, checked on our measurements.
pub fn claims(m: &Measurements) -> Vec<super::table::Claim> {
    use super::table::Claim;
    let r1 = |method: &str| m.value(TABLE_MAIN, method, "", "R@1");
    let ab = |setting: &str| m.value(TABLE_ABLATION, "Smooth-AP", setting, "mAP");
    let entries = |settings: &[&str]| -> Vec<(String, Option<f64>)> {
        settings.iter().map(|s| (s.to_string(), ab(s))).collect()
    };
    vec![
        Claim::best_of(
            "Smooth-AP beats FastAP and Blackbox AP at the same batch (Table 2, R@1)",
            "Smooth-AP",
            &[
                ("FastAP".to_string(), r1("FastAP [5]")),
                ("Blackbox AP".to_string(), r1("Blackbox AP [54]")),
                ("Smooth-AP".to_string(), r1("Smooth-AP BS=224")),
            ],
        ),
        Claim::greater(
            "A larger batch improves Smooth-AP (Table 2: BS 384 > 224, R@1)",
            ("larger batch", r1("Smooth-AP BS=384")),
            ("base batch", r1("Smooth-AP BS=224")),
        ),
        Claim::best_of(
            "τ = 0.01 is the best temperature (Table 5, mAP)",
            "tau=0.01",
            &entries(&["tau=0.1", "tau=0.01", "tau=0.001"]),
        ),
        Claim::best_of(
            "Few positives per class (|P| = 4) is best (Table 5, mAP)",
            "P=4",
            &entries(&["P=4", "P=8", "P=16"]),
        ),
        Claim::increasing(
            "A larger batch is better (Table 5, mAP, batch sizes scaled to ours)",
            &entries(&["batch=64", "batch=128", "batch=256"]),
        ),
    ]
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

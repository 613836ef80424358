//! RaMBO (Rolínek et al., CVPR 2020): the SOP comparison (Table 2) — the recall loss with its two
//! weightings against the baselines — plus the comparisons the paper argues in its text: the
//! recall loss against the AP loss, and the margin α on or off.
//!
//! Rows we do not implement (lifted structure, binomial deviance, N-pair, …) are left out; the
//! contrastive, triplet and FastAP rows run our implementations of those losses.

use super::table::{data_name, run_tables, Column, Measurements, TableSpec, Variant};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::config::{
    ContrastiveConfig, FastApConfig, LossConfig, RamboConfig, RamboMetric, TripletConfig,
};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "rambo";
/// Table 2 (SOP, R@K).
pub const TABLE_MAIN: &str = "Table 2";
/// Table 7 (ablation of the score memory and the margin, R@1).
pub const TABLE_ABLATION: &str = "Table 7";
/// Recall vs AP loss, margin on/off (argued in the text; no published table).
pub const TABLE_LOSS: &str = "Loss and margin (ours)";
/// The paper's setting of its ResNet-50 rows (RaMBO, FastAP).
pub const R50: &str = "backbone=R50;dim=512";
/// The paper's setting of the GoogLeNet baselines it copies from [42].
pub const G512: &str = "backbone=G;dim=512";
/// The score memory of our "full RaMBO" (the paper does not print its τ).
pub const MEMORY_BATCHES: usize = 4;

fn rambo(metric: RamboMetric, margin: f64) -> LossConfig {
    rambo_memory(metric, margin, 0)
}

fn rambo_memory(metric: RamboMetric, margin: f64, memory: usize) -> LossConfig {
    LossConfig::Rambo(RamboConfig {
        metric,
        margin,
        memory,
        ..RamboConfig::default()
    })
}

/// The tables' rows and columns.
pub fn tables(base: &crate::train::TrainConfig) -> Vec<TableSpec> {
    let margin = RamboConfig::default().margin;
    let recall = vec![
        Column::same("R@1", Some(0)),
        Column::same("R@10", Some(0)),
        Column::same("R@100", Some(0)),
        Column::same("R@1000", Some(0)),
    ];
    let main = vec![
        Variant::with_setting("Contrastive [42]", G512, |c| {
            c.loss = LossConfig::Contrastive(ContrastiveConfig::default())
        })
        .note("ours: cosine contrastive (margins 0.9/0.6)"),
        Variant::with_setting("Triplet [42]", G512, |c| {
            c.loss = LossConfig::Triplet(TripletConfig::default())
        })
        .note("ours: TL_SH mining"),
        Variant::with_setting("FastAP [4]", R50, |c| {
            c.loss = LossConfig::FastAp(FastApConfig::default())
        }),
        Variant::with_setting("RaMBO log", R50, move |c| {
            c.loss = rambo(RamboMetric::RecallLog, margin)
        }),
        Variant::with_setting("RaMBO log log", R50, move |c| {
            c.loss = rambo(RamboMetric::RecallLogLog, margin)
        }),
    ];
    let memory_note = format!("ours: log log, memory of {MEMORY_BATCHES} batches");
    let ablation = vec![
        Variant::with_setting("RaMBO", "memory=on;margin=on", move |c| {
            c.loss = rambo_memory(RamboMetric::RecallLogLog, margin, MEMORY_BATCHES)
        })
        .note(memory_note.clone()),
        Variant::with_setting("RaMBO", "memory=off", move |c| {
            c.loss = rambo(RamboMetric::RecallLogLog, margin)
        })
        .note("ours: log log"),
        Variant::with_setting("RaMBO", "margin=off", move |c| {
            c.loss = rambo_memory(RamboMetric::RecallLogLog, 0.0, MEMORY_BATCHES)
        })
        .note(memory_note),
    ];
    let mut losses = Vec::new();
    for (name, metric) in [
        ("RaMBO AP loss", RamboMetric::Ap),
        ("RaMBO log", RamboMetric::RecallLog),
        ("RaMBO log log", RamboMetric::RecallLogLog),
    ] {
        for m in [margin, 0.0] {
            losses.push(Variant::with_setting(
                name,
                format!("margin={m}"),
                move |c| c.loss = rambo(metric, m),
            ));
        }
    }
    vec![
        TableSpec {
            name: TABLE_MAIN.into(),
            dataset: "SOP".into(),
            variants: main,
            columns: recall,
        },
        TableSpec {
            name: TABLE_ABLATION.into(),
            dataset: "SOP".into(),
            variants: ablation,
            columns: vec![Column::same("R@1", Some(0))],
        },
        TableSpec {
            name: TABLE_LOSS.into(),
            dataset: data_name(base),
            variants: losses,
            columns: vec![
                Column::same("R@1", Some(0)),
                Column::same("mAP@R", Some(0)),
                Column::same("mAP", Some(0)),
            ],
        },
    ]
}

/// RaMBO's experiments ([`super::Experiment`]): every row a training run of the recipe.
pub const EXPERIMENT: super::TrainedPaper = super::TrainedPaper {
    key: PAPER,
    name: "RaMBO",
    measure,
    claims: |m, _| claims(m),
    figures,
};

/// Trains every row at `scale` and returns our cells.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    let base = recipe.base(scale)?;
    run_tables(runner, &base, scale, &tables(&base))
}

/// The paper's qualitative claims, checked on our measurements.
pub fn claims(m: &Measurements) -> Vec<super::table::Claim> {
    use super::table::Claim;
    let r1 = |method: &str, setting: &str| m.value(TABLE_MAIN, method, setting, "R@1");
    let margin = RamboConfig::default().margin;
    let ab = |method: &str, mg: f64| m.value(TABLE_LOSS, method, &format!("margin={mg}"), "R@1");
    let t7 = |setting: &str| m.value(TABLE_ABLATION, "RaMBO", setting, "R@1");
    vec![
        Claim::greater(
            "The log log recall weighting beats log (Table 2, R@1)",
            ("log log", r1("RaMBO log log", R50)),
            ("log", r1("RaMBO log", R50)),
        ),
        Claim::best_of(
            "RaMBO beats contrastive, triplet and FastAP (Table 2, R@1)",
            "RaMBO log log",
            &[
                ("contrastive".to_string(), r1("Contrastive [42]", G512)),
                ("triplet".to_string(), r1("Triplet [42]", G512)),
                ("FastAP".to_string(), r1("FastAP [4]", R50)),
                ("RaMBO log log".to_string(), r1("RaMBO log log", R50)),
            ],
        ),
        Claim::greater(
            "The score memory helps (Table 7, R@1)",
            ("with memory", t7("memory=on;margin=on")),
            ("without memory", t7("memory=off")),
        ),
        Claim::greater(
            "The margin helps (Table 7, R@1, with memory)",
            ("with margin", t7("memory=on;margin=on")),
            ("without margin", t7("margin=off")),
        ),
        Claim::greater(
            "Optimising recall beats optimising AP for R@1 (Sec. 5)",
            ("recall log log", ab("RaMBO log log", margin)),
            ("AP loss", ab("RaMBO AP loss", margin)),
        ),
    ]
}

/// The figure: the test R@1 of Table 2's methods over training.
pub fn figures(m: &Measurements, _tables: &[super::ReproducedTable]) -> Result<Vec<super::Figure>> {
    Ok(vec![super::Figure {
        stem: "rambo_training".into(),
        chart: super::publish::training_curves(
            m,
            TABLE_MAIN,
            "R@1",
            Some(0),
            "RaMBO Table 2 methods: test R@1 during training",
        )?,
    }])
}

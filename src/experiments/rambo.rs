//! RaMBO (Rolínek et al., CVPR 2020): the SOP comparison (Table 2) — the recall loss with its two
//! weightings against the baselines — plus the comparisons the paper argues in its text: the
//! recall loss against the AP loss, and the margin α on or off.
//!
//! Rows we do not implement (lifted structure, binomial deviance, N-pair, …) are left out; the
//! contrastive, triplet and FastAP rows run our implementations of those losses.

use super::table::{dataset_name, run_tables, Column, Measurements, TableSpec, Unit, Variant};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::config::{
    ContrastiveConfig, FastApConfig, LossConfig, RamboConfig, RamboMetric, TripletConfig,
};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "rambo";
/// Table 2 (SOP, R@K).
pub const TABLE_MAIN: &str = "RaMBO Table 2";
/// Recall vs AP loss, margin on/off (argued in the text; no published table).
pub const TABLE_ABLATION: &str = "RaMBO loss and margin";

fn rambo(metric: RamboMetric, margin: f64) -> LossConfig {
    LossConfig::Rambo(RamboConfig {
        metric,
        margin,
        ..RamboConfig::default()
    })
}

/// The tables' rows and columns.
pub fn tables() -> Vec<TableSpec> {
    let margin = RamboConfig::default().margin;
    let recall = vec![
        Column::same("R@1", Some(0)),
        Column::same("R@10", Some(0)),
        Column::same("R@100", Some(0)),
        Column::same("R@1000", Some(0)),
    ];
    let main = vec![
        Variant::new("Contrastive_G^512 [42]", |c| {
            c.loss = LossConfig::Contrastive(ContrastiveConfig::default())
        })
        .note("ours: small CNN, cosine contrastive (margins 0.9/0.6)"),
        Variant::new("Triplet_G^512 [42]", |c| {
            c.loss = LossConfig::Triplet(TripletConfig::default())
        })
        .note("ours: small CNN, TL_SH mining"),
        Variant::new("FastAP_R50^512 [4]", |c| {
            c.loss = LossConfig::FastAp(FastApConfig::default())
        }),
        Variant::new("RaMBO_R50^512 log", move |c| {
            c.loss = rambo(RamboMetric::RecallLog, margin)
        }),
        Variant::new("RaMBO_R50^512 log log", move |c| {
            c.loss = rambo(RamboMetric::RecallLogLog, margin)
        }),
    ];
    let mut ablation = Vec::new();
    for (name, metric) in [
        ("RaMBO AP loss", RamboMetric::Ap),
        ("RaMBO log", RamboMetric::RecallLog),
        ("RaMBO log log", RamboMetric::RecallLogLog),
    ] {
        for m in [margin, 0.0] {
            ablation.push(Variant::with_setting(
                name,
                format!("margin={m}"),
                move |c| c.loss = rambo(metric, m),
            ));
        }
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
            columns: vec![
                Column::same("R@1", Some(0)),
                Column::same("mAP@R", Some(0)),
                Column::same("mAP", Some(0)),
            ],
            unit: Unit::Percent,
        },
    ]
}

/// Trains every row at `scale` and returns our cells.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    let base = recipe.base(scale)?;
    run_tables(runner, &base, &dataset_name(scale), &tables())
}

/// The paper's qualitative claims, checked on our measurements.
pub fn claims(m: &Measurements) -> Vec<super::table::Claim> {
    use super::table::Claim;
    let r1 = |method: &str| m.value(TABLE_MAIN, method, "", "R@1");
    let margin = RamboConfig::default().margin;
    let ab =
        |method: &str, mg: f64| m.value(TABLE_ABLATION, method, &format!("margin={mg}"), "R@1");
    vec![
        Claim::greater(
            "The log log recall weighting beats log (Table 2, R@1)",
            ("log log", r1("RaMBO_R50^512 log log")),
            ("log", r1("RaMBO_R50^512 log")),
        ),
        Claim::best_of(
            "RaMBO beats contrastive, triplet and FastAP (Table 2, R@1)",
            "RaMBO log log",
            &[
                ("contrastive".to_string(), r1("Contrastive_G^512 [42]")),
                ("triplet".to_string(), r1("Triplet_G^512 [42]")),
                ("FastAP".to_string(), r1("FastAP_R50^512 [4]")),
                ("RaMBO log log".to_string(), r1("RaMBO_R50^512 log log")),
            ],
        ),
        Claim::greater(
            "Optimising recall beats optimising AP for R@1 (Sec. 5)",
            ("recall log log", ab("RaMBO log log", margin)),
            ("AP loss", ab("RaMBO AP loss", margin)),
        ),
        Claim::greater(
            "The margin α helps (Sec. 4.2, R@1)",
            ("with margin", ab("RaMBO log log", margin)),
            ("without margin", ab("RaMBO log log", 0.0)),
        ),
    ]
}

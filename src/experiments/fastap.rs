//! FastAP (Cakir et al., CVPR 2019): the SOP rows of the poster's comparison (batch M = 96 and
//! 256), the effect of the batch size, and the effect of the authors' meta-class pair sampler.
//!
//! The poster's claim is that larger batches help (a batch is a "retrieval set": more of the
//! ranking is seen at once) and that sampling pairs of meta-classes (hard negatives from the
//! same super-class) is essential. The quick scale scales the batch sizes to the recipe's base
//! batch `B` (M = 256 ↔ `B`); the sweep runs `B/4 … 2B`.

use super::claim::{row, Claim, Row};
use super::table::{
    data_name, run_tables, set_batch_size, Column, Measurements, TableSpec, Variant,
};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::{fastap::FastAp, LossConfig};
use crate::train::{SamplerConfig, TrainConfig};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "fastap";
/// The poster's results table (SOP rows).
pub const TABLE_MAIN: &str = "Poster";
/// Our batch-size sweep (no published values: the poster reports M = 96 and 256 only).
pub const TABLE_BATCH: &str = "Batch size (ours)";
/// Sampler ablation (the authors' meta-class pairs vs m-per-class; no published values).
pub const TABLE_SAMPLER: &str = "Sampler (ours)";
/// The poster's setting of its ResNet-50 row with batch M = 96.
pub const SETTING_96: &str = "backbone=ResNet-50;batch=96;dim=512";
/// The poster's setting of its ResNet-50 row with batch M = 256.
pub const SETTING_256: &str = "backbone=ResNet-50;batch=256;dim=512";

fn fastap(c: &mut TrainConfig) {
    c.loss = LossConfig::FastAp(FastAp::default());
}

/// The batch sizes of the sweep for base batch `b`, rounded to multiples of `m` (each ≥ 2m).
pub fn sweep_batches(b: usize, m: usize) -> Vec<usize> {
    let mut out: Vec<usize> = [b / 4, b / 2, b, 2 * b]
        .into_iter()
        .map(|x| (x / m).max(2) * m)
        .collect();
    out.dedup();
    out
}

fn samples_per_class(config: &TrainConfig) -> usize {
    match &config.sampler {
        SamplerConfig::MPerClass {
            samples_per_class, ..
        } => *samples_per_class,
        _ => 1,
    }
}

/// The tables' rows and columns for a base recipe.
pub fn tables(base: &TrainConfig) -> Vec<TableSpec> {
    let b = base.sampler.batch_size();
    let m = samples_per_class(base);
    let small = ((b * 96 / 256) / m).max(2) * m;
    let recall = vec![
        Column::same("R@1", Some(0)),
        Column::same("R@10", Some(0)),
        Column::same("R@100", Some(0)),
        Column::same("R@1000", Some(0)),
    ];
    let main = vec![
        Variant::with_setting("FastAP", SETTING_96, move |c| {
            fastap(c);
            set_batch_size(c, small);
        })
        .note(format!("ours: batch {small}")),
        Variant::with_setting("FastAP", SETTING_256, fastap).note(format!("ours: batch {b}")),
    ];
    let batch = sweep_batches(b, m)
        .into_iter()
        .map(|bs| {
            Variant::with_setting("FastAP", format!("batch={bs}"), move |c| {
                fastap(c);
                set_batch_size(c, bs);
            })
        })
        .collect();
    let sampler = vec![
        Variant::with_setting("FastAP", "sampler=m_per_class", fastap),
        Variant::with_setting("FastAP", "sampler=meta_class_pairs", move |c| {
            fastap(c);
            // The authors' sampler: each batch draws from two meta-classes, batches_per_meta_pair
            // batches in a row. The meta-class is the coarsest level, as SOP's super-classes
            // (12 there, 8 families here). An epoch is (pairs × 2) batches: 28 × 2 = 56 at the
            // quick scale, exactly the m-per-class epoch, so the two rows train the same number
            // of steps. (Pairs of variants, one level down, gave 496 pairs: 18× the steps,
            // which would credit the sampler with the longer training.)
            c.sampler = SamplerConfig::FastAp(crate::samplers::FastApConfig {
                batch_size: b,
                batches_per_meta_pair: 2,
                class_level: 0,
                meta_level: 2,
                shuffle_within_class: false,
            });
        })
        .note("ours: pairs of families (the coarsest level), 2 batches per pair"),
    ];
    let summary = vec![Column::same("R@1", Some(0)), Column::same("mAP@R", Some(0))];
    let ours = data_name(base);
    vec![
        TableSpec {
            name: TABLE_MAIN.into(),
            dataset: "SOP".into(),
            variants: main,
            columns: recall,
        },
        TableSpec {
            name: TABLE_BATCH.into(),
            dataset: ours.clone(),
            variants: batch,
            columns: summary.clone(),
        },
        TableSpec {
            name: TABLE_SAMPLER.into(),
            dataset: ours,
            variants: sampler,
            columns: summary,
        },
    ]
}

/// FastAP's experiments ([`super::Experiment`]): every row a training run of the recipe.
pub const EXPERIMENT: super::TrainedPaper = super::TrainedPaper {
    key: PAPER,
    name: "FastAP",
    measure,
    claims,
    figures,
};

/// Trains every row at `scale` (every seed) and returns our cells.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    run_tables(runner, recipe, scale, tables)
}

/// The poster's claims ("larger batches give longer lists and harder retrieval problems";
/// "use side information: meta-class labels"), checked on our measurements.
pub fn claims(m: &Measurements, base: &TrainConfig) -> Vec<Claim> {
    let b = base.sampler.batch_size();
    let m_pc = samples_per_class(base);
    let sweep = |metric: &str| -> Vec<Row> {
        sweep_batches(b, m_pc)
            .into_iter()
            .map(|bs| {
                let s = format!("batch={bs}");
                let v = m.sample(TABLE_BATCH, "FastAP", &s, metric);
                row(s, v)
            })
            .collect()
    };
    let summary = ["R@1", "mAP@R"];
    vec![
        // The poster's own rows: M = 256 is ahead at R@1 only (76.4 vs 75.8); at R@10, 100
        // and 1000 M = 96 is as good or better (89.1 / 95.4 / 98.5 vs 89.0 / 95.1 / 98.2).
        Claim::greater(
            "A larger batch helps: M = 256 beats M = 96 at R@1 (poster, SOP: 76.4 vs 75.8; ours: \
             the base batch vs 96/256 of it)",
            row("M=256", m.sample(TABLE_MAIN, "FastAP", SETTING_256, "R@1")),
            row("M=96", m.sample(TABLE_MAIN, "FastAP", SETTING_96, "R@1")),
        ),
        Claim::on_each(
            "Retrieval improves with every increase of the batch size (poster: larger batches \
             give longer lists; ours: ¼, ½, 1, 2× the base batch, R@1 and mAP@R)",
            &summary,
            |k| Claim::increasing("", &sweep(k)),
        ),
        Claim::on_each(
            "Batches of meta-class pairs (the authors' sampler) beat m-per-class batches \
             (poster: use meta-class side information; R@1 and mAP@R)",
            &summary,
            |k| {
                Claim::greater(
                    "",
                    row(
                        "meta-class pairs",
                        m.sample(TABLE_SAMPLER, "FastAP", "sampler=meta_class_pairs", k),
                    ),
                    row(
                        "m-per-class",
                        m.sample(TABLE_SAMPLER, "FastAP", "sampler=m_per_class", k),
                    ),
                )
            },
        ),
    ]
}

/// The figures: R@1 against our batch size, and the test R@1 of each batch size over training.
pub fn figures(m: &Measurements, _tables: &[super::ReproducedTable]) -> Result<Vec<super::Figure>> {
    use super::publish::training_curves;
    use crate::report::{sweep, Sweep};
    let mut points: Vec<(f64, f64, f64)> = m
        .cells
        .iter()
        .filter(|c| c.table == TABLE_BATCH && c.metric == "R@1")
        .filter_map(|c| {
            let b = crate::report::published::setting_value(&c.setting, "batch")?;
            Some((b.parse::<f64>().ok()?, c.value, c.sample().ci95()))
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let with_ci = points.iter().all(|p| p.2.is_finite());
    let ours = Sweep {
        name: "R@1".into(),
        paper: Vec::new(),
        ours: points.iter().map(|p| (p.0, p.1)).collect(),
        ours_ci: if with_ci {
            points.iter().map(|p| p.2).collect()
        } else {
            Vec::new()
        },
    };
    Ok(vec![
        super::Figure {
            stem: "fastap_batch".into(),
            chart: sweep(
                "FastAP: R@1 against the batch size (ours)",
                "batch size",
                "R@1",
                &[ours],
                true,
            )?,
        },
        super::Figure {
            stem: "fastap_training".into(),
            chart: training_curves(
                m,
                TABLE_BATCH,
                "R@1",
                Some(0),
                "FastAP: test R@1 during training, by batch size",
            )?,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_covers_a_quarter_to_twice_the_base_batch() {
        assert_eq!(sweep_batches(64, 4), vec![16, 32, 64, 128]);
        assert_eq!(sweep_batches(8, 2), vec![4, 8, 16]);
    }
}

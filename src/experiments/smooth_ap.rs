//! Smooth-AP (Brown et al., ECCV 2020): the SOP and iNaturalist comparisons (Tables 2 and 3
//! right), fine-tuning pretrained face models (Table 4) and the ablations of τ, the positives per
//! class |P| and the batch size (Table 5).
//!
//! What each row runs at the `quick` and `tiny` scales: every row trains the recipe's network
//! with the row's loss and sampler; the published rows we do not implement (Margin, Divide,
//! MIC, contrastive with a cross-batch memory) are left out, and plain contrastive and Triplet
//! Semi-Hard rows are added to Table 2 for context (the triplet is published in Table 3 only,
//! the contrastive nowhere). Table 3's iNaturalist columns are Table 2's runs
//! (one embedded dataset stands for both) plus its own Proxy NCA† row
//! ([`crate::losses::proxy_nca`], the re-implementation the paper ran). The batch sizes of the
//! paper (224/384; 64/128/256 in the ablations) are scaled to the recipe's base batch `B` in the
//! same ratios (`B`, `B·384/224`; `B/2`, `B`, `2B`), noted in each row.
//!
//! Table 4 fine-tunes two face models, trained by their authors on the VGGFace2 train set, with
//! a pairwise, a triplet or the Smooth-AP loss appended. Ours: the recipe's network trained on
//! the same training classes with a softmax classifier — NormSoftmax for the SENet-50 model
//! (softmax-trained), ArcFace (NormSoftmax with an additive angular margin, `m = 0.5`, `s = 64`)
//! for the ArcFace model — for the recipe's epochs, then fine-tuned with each loss for a quarter
//! of them ([`crate::train::PretrainStage`]); the baseline row is the pretrained network itself.
//! VGGFace2-Test and IJB-C are two test sets of the paper; ours is one, so both columns are the
//! same runs.

use super::claim::{row, Claim};
use super::table::{
    run_tables, set_batch_size, set_samples_per_class, Column, Measurements, TableSpec, Variant,
};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::{
    contrastive::Contrastive, fastap::FastAp, norm_softmax::NormSoftmaxConfig,
    proxy_nca::ProxyNcaConfig, rambo::RamboConfig, smooth_ap::SmoothAp, triplet::Triplet,
    LossConfig,
};
use crate::train::{PretrainStage, TrainConfig};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "smooth_ap";
/// Table 2 (SOP, R@K).
pub const TABLE_MAIN: &str = "Table 2";
/// Table 3, right (iNaturalist, R@K): the same runs, the paper's iNaturalist columns.
pub const TABLE_INAT: &str = "Table 3 right";
/// Table 3's Proxy NCA row (the only row of that table not in Table 2).
pub const PROXY_NCA: &str = "Proxy NCA† [42]";
/// Table 4, face retrieval: pretrained models fine-tuned with each loss (mAP).
pub const TABLE_FACE: &str = "Table 4";
/// The paper's second test set of Table 4 (our one test set stands beside both).
pub const FACE_SECOND_DATASET: &str = "IJB-C";
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

/// Table 3's "Proxy NCA†": ProxyNCA as Roth & Brattoli re-implemented it (the paper's [55], one
/// proxy per training class), at our batch `b` as the paper ran every iNaturalist baseline at
/// its 224.
fn proxy_nca_row(b: usize) -> Variant {
    Variant::new(PROXY_NCA, |c| {
        c.loss = LossConfig::ProxyNca(ProxyNcaConfig::default())
    })
    .note(format!(
        "ours: ProxyNCA as Roth & Brattoli re-implemented it (scale 3, one proxy per class), \
         batch {b}"
    ))
}

/// One face model of Table 4: the paper's name for it, its setting and baseline row, and how
/// ours is trained before fine-tuning (a classifier on the training classes) with a note saying
/// so. Rows and claims both read it.
struct FaceModel {
    name: &'static str,
    setting: &'static str,
    baseline: &'static str,
    pretrain: LossConfig,
    how: &'static str,
}

/// The two face models of Table 4.
fn face_models() -> [FaceModel; 2] {
    [
        FaceModel {
            name: "SENet-50",
            setting: "model=SENet-50",
            baseline: "Softmax (baseline)",
            pretrain: LossConfig::NormSoftmax(NormSoftmaxConfig::default()),
            how: "ours: softmax-trained (NormSoftmax, σ = 0.05)",
        },
        FaceModel {
            name: "ArcFace",
            setting: "model=ArcFace ResNet-50",
            baseline: "ArcFace (baseline)",
            pretrain: LossConfig::NormSoftmax(NormSoftmaxConfig {
                temperature: 1.0 / 64.0,
                margin: 0.5,
            }),
            how: "ours: ArcFace-trained (m = 0.5, s = 64)",
        },
    ]
}

/// Table 4's fine-tuning of a recipe: its network trained with `pretrain` for its epochs and
/// schedule, then with `loss` for a quarter of the epochs (at least one), its schedule shortened
/// in proportion ([`LrSchedule::shortened`](crate::train::schedule::LrSchedule::shortened)) —
/// Smooth-AP "appended" to a trained model.
fn fine_tune(c: &mut TrainConfig, pretrain: &LossConfig, loss: LossConfig) {
    let epochs = (c.epochs / 4).max(1);
    c.pretrain = Some(PretrainStage {
        loss: pretrain.clone(),
        epochs: c.epochs,
        sampler: None,
        optimizer: None,
        schedule: Some(c.schedule.clone()),
    });
    c.schedule = c.schedule.shortened(c.epochs, epochs);
    c.loss = loss;
    c.epochs = epochs;
}

/// Table 4's rows: each face model as trained (the baseline) and fine-tuned with the
/// pairwise, the triplet and the Smooth-AP loss.
fn face_rows() -> Vec<Variant> {
    let mut rows = Vec::new();
    for model in face_models() {
        let p = model.pretrain.clone();
        rows.push(
            Variant::with_setting(model.baseline, model.setting, move |c| c.loss = p.clone())
                .note(model.how),
        );
        let appended = [
            (
                "+ Pairwise",
                LossConfig::Contrastive(Contrastive::default()),
            ),
            ("+ Triplet", LossConfig::Triplet(Triplet::default())),
            ("+ Smooth-AP", smooth_ap(0.01)),
        ];
        for (method, loss) in appended {
            let p = model.pretrain.clone();
            rows.push(
                Variant::with_setting(method, model.setting, move |c| {
                    fine_tune(c, &p, loss.clone())
                })
                .note(format!("{}, fine-tuned for ¼ of its epochs", model.how)),
            );
        }
    }
    rows
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
            // One set of runs fills both tables' columns: say so where a reader looks. Proxy
            // NCA† is Table 3's alone.
            comparison_rows(b, big)
                .into_iter()
                .map(|v| v.and_note("the same runs as Table 2"))
                .chain([proxy_nca_row(b)])
                .collect(),
            recall(["R@1", "R@4", "R@16", "R@32"]),
        ),
        spec(TABLE_FACE, ABLATION_DATASET, face_rows(), map()),
        spec(
            TABLE_FACE,
            FACE_SECOND_DATASET,
            face_rows()
                .into_iter()
                .map(|v| v.and_note("the same runs as the VGGFace2-Test column"))
                .collect(),
            map(),
        ),
        spec(TABLE_TAU, ABLATION_DATASET, tau, map()),
        spec(TABLE_POSITIVES, ABLATION_DATASET, positives, map()),
        spec(TABLE_BATCH, ABLATION_DATASET, batches, map()),
    ]
}

/// Trains every row of Tables 2, 4 and 5 at `scale` (every seed) and returns our cells.
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    run_tables(runner, recipe, scale, tables)
}

/// The paper's claims as it states them (Sec. 5.2–5.4, Tables 2, 3, 4 and 5), checked on our
/// measurements. Table 3's iNaturalist columns are Table 2's runs plus Proxy NCA†'s, so its
/// claim is the one its text makes of R@1 against every baseline, Proxy NCA† included.
pub fn claims(m: &Measurements) -> Vec<Claim> {
    let main =
        |method: &str, setting: &str, metric: &str| m.sample(TABLE_MAIN, method, setting, metric);
    let inat = |method: &str, setting: &str| m.sample(TABLE_INAT, method, setting, "R@1");
    let ab =
        |table: &str, setting: &str| row(setting, m.sample(table, "Smooth-AP", setting, "mAP"));
    let recalls = ["R@1", "R@10", "R@100", "R@1000"];
    let face = |method: &str, setting: &str| m.sample(TABLE_FACE, method, setting, "mAP");
    let models = face_models();
    let model_names = models.each_ref().map(|f| f.name);
    // Table 4's model named in a claim (one of `model_names`).
    let face_model = |name: &str| models.iter().find(|f| f.name == name);
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
        Claim::greater_all(
            "Smooth-AP outperforms every compared method at the same batch on iNaturalist at \
             R@1 (Table 3 right, batch 224: 65.9 against Triplet Semi-Hard 58.1, Proxy NCA† \
             61.6, FastAP 60.6 and Blackbox AP 62.9; the text: \"by 2–5%\")",
            row("Smooth-AP", inat("Smooth-AP", "batch=224")),
            &[
                row("Triplet SH", inat("Triplet Semi-Hard [74]", "")),
                row("Proxy NCA†", inat(PROXY_NCA, "")),
                row("FastAP", inat("FastAP [5]", "")),
                row("Blackbox AP", inat("Blackbox AP [54]", "")),
            ],
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
        Claim::on_each(
            "Appending Smooth-AP to a trained face model improves its mAP, for both models \
             (Table 4: SENet-50 0.828 → 0.850 on VGGFace2-Test and 0.726 → 0.754 on IJB-C; \
             ArcFace 0.858 → 0.902 and 0.772 → 0.803; ours: one test set for both columns)",
            &model_names,
            |name| {
                let model = face_model(name);
                let (setting, baseline) = model.map_or(("", ""), |f| (f.setting, f.baseline));
                Claim::greater(
                    "",
                    row("+ Smooth-AP", face("+ Smooth-AP", setting)),
                    row(baseline, face(baseline, setting)),
                )
            },
        ),
        Claim::on_each(
            "Smooth-AP fine-tuning beats pairwise and triplet fine-tuning, for both models \
             (Table 4: SENet-50 0.850 vs 0.828 and 0.845 on VGGFace2-Test, 0.754 vs 0.728 and \
             0.740 on IJB-C; ArcFace 0.902 vs 0.861 and 0.880, 0.803 vs 0.775 and 0.787)",
            &model_names,
            |name| {
                let setting = face_model(name).map_or("", |f| f.setting);
                Claim::greater_all(
                    "",
                    row("+ Smooth-AP", face("+ Smooth-AP", setting)),
                    &[
                        row("+ Pairwise", face("+ Pairwise", setting)),
                        row("+ Triplet", face("+ Triplet", setting)),
                    ],
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
    use crate::train::Decay;

    #[test]
    fn each_face_baseline_is_the_network_its_fine_tuning_starts_from() {
        let mut base = TrainConfig {
            epochs: 16,
            ..TrainConfig::default()
        };
        base.schedule.decay = Decay::Cosine {
            t_max: 16,
            eta_min: 0.0,
            torch_recursive: false,
        };
        let rows = face_rows();
        assert_eq!(rows.len(), 8);
        for model in rows.chunks(4) {
            let baseline = model[0].spec(&base).config;
            assert!(baseline.pretrain.is_none() && baseline.epochs == 16);
            for tuned in &model[1..] {
                let c = tuned.spec(&base).config;
                assert_eq!(
                    c.pretrain_recipe().as_ref(),
                    Some(&baseline),
                    "{}",
                    tuned.method
                );
                assert_eq!(c.epochs, 4);
                assert!(matches!(c.schedule.decay, Decay::Cosine { t_max: 4, .. }));
                assert_ne!(c.loss, baseline.loss);
            }
        }
        // The two models are trained differently (ArcFace's margin).
        assert_ne!(rows[0].spec(&base).config, rows[4].spec(&base).config);
        // A multi-step schedule falls at the same fractions of the shorter fine-tuning.
        base.schedule.decay = Decay::MultiStep {
            milestones: vec![8, 12],
            gamma: 0.3,
        };
        let c = rows[3].spec(&base).config;
        assert_eq!(
            c.schedule.decay,
            Decay::MultiStep {
                milestones: vec![2, 3],
                gamma: 0.3
            }
        );
        assert_eq!(c.pretrain_recipe().unwrap().schedule, base.schedule);
        // A quick recipe (4 epochs, constant rate) fine-tunes for one.
        base.epochs = 4;
        base.schedule = Default::default();
        assert_eq!(rows[7].spec(&base).config.epochs, 1);
    }

    #[test]
    fn batches_scale_in_the_papers_ratio() {
        assert_eq!(scaled_batch(64, 384, 224, 4), 108);
        assert_eq!(scaled_batch(224, 384, 224, 4), 384);
        assert_eq!(scaled_batch(8, 384, 224, 2), 14);
        assert_eq!(scaled_batch(1, 1, 10, 4), 4);
    }
}

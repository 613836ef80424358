//! HAPPIER (Ramzi et al., ECCV 2022): hierarchical metrics of fine-only and hierarchical losses
//! (Table 1), per-level AP (Table 3), the parts of the loss (Table 5), the relevance function
//! used for training (Table 6), and the sweeps of α and λ (Fig. 4).
//!
//! The embedded dataset has three levels (fine class, variant, family), like DyML; SOP has two.
//! "Coarse AP" is the AP at the coarsest level (positives = same family). NCA++ is ProxyNCA++
//! ([`crate::losses::proxy_nca_pp`], T = 1/9, the authors' code HAPPIER's authors ran), its
//! proxies trained like NSM's and CSL's by the run's loss group. CSL ([`crate::losses::csl`],
//! the authors' re-implementation: s = 32, one margin per level) trains with the authors'
//! margins for the data's depth, 0.25 / 0.35 / 0.45 on the three levels. Table 5's first row
//! (a sigmoid surrogate "as in [38, 2]" instead of the paper's steps) is not run: its exact
//! form is not specified.
//!
//! Table 2 applies the DyML protocol to Table 1's runs: each label column (fine class, variant,
//! family) is one semantic scale with binary labels; mAP, the binary ASI and R@1 of each scale
//! are averaged over the three. DyML evaluates each scale on its own query and gallery sets;
//! here every scale ranks the same test set against itself (leave one out), so Table 2 shares
//! its runs and its test images with Table 1.
//!
//! Table 4 (iNat-full, seven levels: species … kingdom) trains on the embedded data with six
//! label levels ([`crate::data::ShapesConfig::levels`]): the same images and the same
//! class-disjoint split as the other tables (split within each variant), with a form between
//! the fine class and the variant and an order and a class above the family. Ours stand beside
//! the paper's first six levels: species = fine class, genus = form, family = variant, order =
//! family (shape), class = order (shapes in pairs), phylum = class (in fours); kingdom is not
//! hosted. The same runs give Table 1's iNat-full columns (H-AP, ASI, NDCG over the six
//! levels), for which Table 4 also trains the two Σ baselines (ours only in Table 4). CSL trains
//! there with the first six of the authors' seven iNat-full margins, 0.15 … 0.65
//! ([`crate::losses::csl::Csl::paper_margins`]); the text's comparison of HAPPIER with CSL on
//! every level of Tables 3 and 4 (+5 species AP, +3 kingdom AP) is checked on every hosted level
//! (the data has no kingdom).
//!
//! ΣwAP as a *test* metric (Table 6) is computed from the per-level APs of the evaluation by
//! HAPPIER's Property 1, `ΣwAP = Σ_p w_p · AP^(p)`, with the weights `w_p ∝ p / L` that the
//! ΣwAP training relevance uses (the paper does not give its weights).

use super::claim::{row, Claim, Row};
use super::table::{run_tables, Column, Measurements, TableSpec, Variant};
use super::{ExperimentRecipe, Runner, Scale};
use crate::error::Result;
use crate::losses::{
    csl::CslConfig, happier::weighted_ap_weights, happier::HappierConfig, happier::RelevanceKind,
    norm_softmax::NormSoftmaxConfig, proxy_nca_pp::ProxyNcaPpConfig, roadmap::Roadmap,
    smooth_ap::SmoothAp, summed_levels::SummedConfig, triplet::Triplet, LossConfig,
};
use crate::report::{Measured, Unit};

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "happier";
/// Table 1 (H-AP, ASI, NDCG).
pub const TABLE_1: &str = "Table 1";
/// Table 2 (the DyML protocol: mAP, ASI and R@1 per semantic scale, averaged over the scales).
pub const TABLE_2: &str = "Table 2";
/// The DyML column Table 2's values stand beside: DyML-Vehicle, a three-level hierarchy trained
/// from random initialisation, as the embedded data and the small CNN are.
pub const DYML_DATASET: &str = "DyML-V";
/// Table 3 (fine R@1, fine AP, coarse AP).
pub const TABLE_3: &str = "Table 3";
/// Table 4 (iNat-full: species R@1 and the AP of every level).
pub const TABLE_4: &str = "Table 4";
/// The paper's dataset of Table 4 and of Table 1's third column group: iNat-full (seven
/// levels; ours six, [`DEEP_LEVELS`]).
pub const DEEP_DATASET: &str = "iNat-full";
/// The label levels of Table 4's data.
pub const DEEP_LEVELS: usize = 6;
/// Table 4's columns: the paper's level names, finest first, for our label columns `0..6`.
pub const DEEP_LEVEL_NAMES: [&str; DEEP_LEVELS] = [
    "Species AP",
    "Genus AP",
    "Family AP",
    "Order AP",
    "Class AP",
    "Phylum AP",
];
/// Table 5 (the parts of the loss).
pub const TABLE_5: &str = "Table 5";
/// Table 6 (training relevance: H-AP vs ΣwAP).
pub const TABLE_6: &str = "Table 6";
/// Fig. 4a (α sweep).
pub const FIG_4A: &str = "Fig. 4a";
/// Fig. 4b (λ sweep).
pub const FIG_4B: &str = "Fig. 4b";
/// The paper's dataset column our values stand beside: iNat-base, the set of Tables 5–6 and
/// Fig. 4 (the embedded dataset is hierarchical like it; SOP has two levels, we have three).
pub const DATASET: &str = "iNat-base";

/// The α values of the Fig. 4a sweep (the paper trains HAPPIER_F with 3 and 5).
pub const ALPHAS: [f64; 4] = [1.0, 2.0, 3.0, 5.0];
/// The λ values of the Fig. 4b sweep.
pub const LAMBDAS: [f64; 5] = [0.0, 0.1, 0.3, 0.5, 0.9];

fn happier(alpha: f64, lambda: f64, relevance: RelevanceKind) -> LossConfig {
    LossConfig::Happier(HappierConfig {
        alpha,
        lambda,
        relevance,
        ..HappierConfig::default()
    })
}

fn triplet() -> LossConfig {
    LossConfig::Triplet(Triplet::default())
}

fn nsm() -> LossConfig {
    LossConfig::NormSoftmax(NormSoftmaxConfig::default())
}

/// ProxyNCA++ at the paper's T = 1/9.
fn nca() -> LossConfig {
    LossConfig::ProxyNcaPp(ProxyNcaPpConfig::default())
}

/// CSL with the authors' scale and, for the data's number of levels, their margins
/// ([`crate::losses::csl::Csl::paper_margins`]).
fn csl() -> LossConfig {
    LossConfig::Csl(CslConfig::default())
}

/// The method name of the CSL rows (Tables 1–4).
const CSL: &str = "CSL [47]";

fn summed(base: LossConfig) -> LossConfig {
    LossConfig::Summed(SummedConfig {
        base: Box::new(base),
        levels: None,
    })
}

fn fine_only(name: &str, loss: LossConfig) -> Variant {
    Variant::new(name, move |c| c.loss = loss.clone())
}

/// A `<dataset> <key>` label of a claim's part (the dataset names have no space).
fn split_key(k: &str) -> (&str, &str) {
    k.split_once(' ')
        .expect("the claims write `<dataset> <key>` labels")
}

/// Table 1's rows, as [`methods`] names them.
const TABLE_1_ROWS: [&str; 10] = [
    "TL_SH [57]",
    "NSM [59]",
    "NCA++ [49]",
    "Smooth-AP [2]",
    "ROADMAP [42]",
    "Σ TL_SH [57]",
    "Σ NSM [59]",
    "Σ NCA++ [49]",
    CSL,
    "HAPPIER",
];

/// The rows of the method comparison (Tables 1 and 3).
fn methods() -> Vec<Variant> {
    vec![
        fine_only("TL_SH [57]", triplet()),
        fine_only("NSM [59]", nsm()),
        fine_only("NCA++ [49]", nca()),
        fine_only("Smooth-AP [2]", LossConfig::SmoothAp(SmoothAp::default())),
        fine_only("ROADMAP [42]", LossConfig::Roadmap(Roadmap::default())),
        fine_only("Σ TL_SH [57]", summed(triplet())),
        fine_only("Σ NSM [59]", summed(nsm())),
        fine_only("Σ NCA++ [49]", summed(nca())),
        fine_only(CSL, csl()).note("the authors' three-level margins, 0.25 / 0.35 / 0.45"),
        fine_only("HAPPIER", happier(1.0, 0.1, RelevanceKind::Pop)),
    ]
}

/// Table 4's rows: Table 1's methods (its two Σ rows give Table 1's iNat-full columns; ours
/// only in Table 4) and HAPPIER_F with the paper's iNat α = 3, each trained on the six-level
/// data (CSL with the margins of its depth).
fn deep_methods() -> Vec<Variant> {
    let mut rows: Vec<Variant> = methods()
        .into_iter()
        .map(|mut v| {
            let sigma = v.method.starts_with('Σ');
            if v.method == CSL {
                v.note = "the first six of the authors' iNat-full margins, 0.15 … 0.65".into();
            }
            let v = on_deep_levels(v);
            if sigma {
                v.and_note("ours only: for Table 1's iNat-full columns")
            } else {
                v
            }
        })
        .collect();
    rows.push(
        on_deep_levels(fine_only(
            "HAPPIER_F",
            happier(3.0, 0.1, RelevanceKind::Pop),
        ))
        .and_note("α = 3 (the paper's iNat setting)"),
    );
    rows
}

/// Row `v` trained on the six-level data ([`DEEP_LEVELS`]).
fn on_deep_levels(v: Variant) -> Variant {
    let Variant {
        method,
        setting,
        note,
        apply,
    } = v;
    Variant {
        method,
        setting,
        note,
        apply: Box::new(move |c| {
            apply(c);
            // The embedded data's deeper labels; a dataset on disk (the `paper` scale) brings
            // its own levels.
            if let Some(data) = c.dataset.embedded_mut() {
                data.levels = DEEP_LEVELS;
                // The variant is label column 2 at six levels: the same split as the
                // three-level tables (split within each variant).
                data.split_level = 2;
            }
        }),
    }
    .and_note("six label levels (species … phylum; no kingdom)")
}

/// The tables' rows and columns; `levels` is the number of label levels of the data.
pub fn tables(levels: usize) -> Vec<TableSpec> {
    let coarse = levels.saturating_sub(1);
    let mut t3 = methods();
    t3.push(
        fine_only("HAPPIER_F", happier(5.0, 0.1, RelevanceKind::Pop))
            .note("ours: α = 5 (the paper's SOP setting)"),
    );
    let t5 = vec![
        Variant::with_setting("HAPPIER", "surrogate=ours;clustering=off", |c| {
            c.loss = happier(1.0, 0.0, RelevanceKind::Pop)
        }),
        Variant::with_setting("HAPPIER", "surrogate=ours;clustering=on", |c| {
            c.loss = happier(1.0, 0.1, RelevanceKind::Pop)
        }),
    ];
    let t6 = vec![
        Variant::with_setting("HAPPIER", "train=H-AP", |c| {
            c.loss = happier(1.0, 0.0, RelevanceKind::Pop)
        }),
        Variant::with_setting("HAPPIER", "train=ΣwAP", |c| {
            c.loss = happier(1.0, 0.0, RelevanceKind::WeightedAp)
        }),
    ];
    let alphas = ALPHAS
        .iter()
        .map(|&alpha| {
            Variant::with_setting("HAPPIER", format!("alpha={alpha}"), move |c| {
                c.loss = happier(alpha, 0.1, RelevanceKind::Pop)
            })
        })
        .collect();
    let lambdas = LAMBDAS
        .iter()
        .map(|&lambda| {
            Variant::with_setting("HAPPIER", format!("lambda={lambda}"), move |c| {
                c.loss = happier(1.0, lambda, RelevanceKind::Pop)
            })
        })
        .collect();
    let hier = vec![
        Column::same("H-AP", None),
        Column::same("ASI", None),
        Column::same("NDCG", None),
    ];
    let fine_ap = Column {
        paper: "Fine AP",
        ours: "mAP",
        level: Some(0),
    };
    let coarse_ap = Column {
        paper: "Coarse AP",
        ours: "mAP",
        level: Some(coarse),
    };
    let fine_r1 = Column {
        paper: "Fine R@1",
        ours: "R@1",
        level: Some(0),
    };
    let spec = |name: &str, variants, columns| TableSpec {
        name: name.into(),
        dataset: DATASET.into(),
        variants,
        columns,
    };
    let mut t4_columns = vec![Column {
        paper: "Species R@1",
        ours: "R@1",
        level: Some(0),
    }];
    t4_columns.extend(
        DEEP_LEVEL_NAMES
            .iter()
            .enumerate()
            .map(|(l, &name)| Column {
                paper: name,
                ours: "mAP",
                level: Some(l),
            }),
    );
    vec![
        spec(TABLE_1, methods(), hier),
        spec(TABLE_3, t3, vec![fine_r1, fine_ap, coarse_ap]),
        TableSpec {
            name: TABLE_4.into(),
            dataset: DEEP_DATASET.into(),
            variants: deep_methods(),
            columns: t4_columns,
        },
        spec(TABLE_5, t5, vec![Column::same("H-AP", None)]),
        spec(
            TABLE_6,
            t6,
            vec![Column::same("H-AP", None), Column::same("NDCG", None)],
        ),
        spec(
            FIG_4A,
            alphas,
            vec![fine_ap, Column::same("H-AP", None), coarse_ap],
        ),
        spec(FIG_4B, lambdas, vec![Column::same("H-AP", None), fine_ap]),
    ]
}

/// ΣwAP of a run (HAPPIER Property 1): `Σ_p w_p · AP^(p)`, `p = 1..L` from the coarsest match
/// (label column `L − 1`) to the same fine class (column 0), with `w_p ∝ p / L`.
pub fn sum_weighted_ap(run: &super::RunResult, levels: usize) -> Result<f64> {
    let w = weighted_ap_weights(levels, 1.0);
    let mut total = 0.0;
    for (p, wp) in (1..=levels).zip(w) {
        total += wp * run.metric("mAP", Some(levels - p))?;
    }
    Ok(total)
}

/// HAPPIER's experiments ([`super::Experiment`]): every row a training run of the recipe.
pub const EXPERIMENT: super::TrainedPaper = super::TrainedPaper {
    key: PAPER,
    name: "HAPPIER",
    measure,
    claims: |m, _| claims(m),
    figures,
};

/// A DyML metric of a run (HAPPIER Table 2): `metric` (`"mAP"`, `"ASI"` or `"R@1"`) of each
/// label column's binary problem, averaged over the `levels` columns.
pub fn dyml_average(run: &super::RunResult, metric: &str, levels: usize) -> Result<f64> {
    let mut total = 0.0;
    for column in 0..levels {
        total += run.metric(metric, Some(column))?;
    }
    Ok(total / levels as f64)
}

/// Trains every row at `scale` (every seed) and returns our cells (Table 6 gets the ΣwAP
/// column, one value per seed; Table 2 the DyML averages of Table 1's runs).
pub fn measure(runner: &Runner, recipe: &ExperimentRecipe, scale: Scale) -> Result<Measurements> {
    let levels = 3;
    let mut out = run_tables(runner, recipe, scale, |_| tables(levels))?;
    let mut extra = Vec::new();
    for r in &out.runs {
        // Same provenance as the run's other cells.
        let provenance = || {
            out.cells
                .iter()
                .find(|c| c.table == r.table && c.method == r.method && c.setting == r.setting)
                .map(|c| c.provenance.clone())
                .ok_or_else(|| {
                    crate::error::Error::invalid(r.table.clone(), "a run without its cells")
                })
        };
        let per_seed = |f: &dyn Fn(&super::RunResult) -> Result<f64>| {
            r.runs.iter().map(f).collect::<Result<Vec<f64>>>()
        };
        let cell = |table: &str, dataset: &str, metric: &str, provenance, values| {
            Measured::over_seeds(
                table,
                r.method.clone(),
                dataset,
                metric,
                values,
                Unit::Fraction,
                provenance,
            )
            .with_setting(r.setting.clone())
        };
        if r.table == TABLE_4 && TABLE_1_ROWS.contains(&r.method.as_str()) {
            let mut deep = provenance()?;
            deep.detail
                .push_str("; Table 4's runs (six label levels), hierarchical metrics over them");
            for metric in ["H-AP", "ASI", "NDCG"] {
                let values = per_seed(&|run| run.metric(metric, None))?;
                extra.push(cell(TABLE_1, DEEP_DATASET, metric, deep.clone(), values));
            }
        }
        if r.table == TABLE_6 {
            let values = per_seed(&|run| sum_weighted_ap(run, levels))?;
            extra.push(cell(TABLE_6, DATASET, "ΣwAP", provenance()?, values));
        }
        if r.table == TABLE_1 {
            let mut dyml = provenance()?;
            dyml.detail.push_str(
                "; Table 1's runs under the DyML protocol (each label column one scale with \
                 binary labels, the test set ranked against itself, the three scales averaged)",
            );
            for metric in ["mAP", "ASI", "R@1"] {
                let values = per_seed(&|run| dyml_average(run, metric, levels))?;
                extra.push(cell(TABLE_2, DYML_DATASET, metric, dyml.clone(), values));
            }
        }
    }
    out.cells.extend(extra);
    Ok(out)
}

/// The paper's claims as it states them (Sec. 4.2–4.4, Tables 1, 3, 5, 6 and Fig. 4), checked
/// on our measurements (beside its iNat-base column: the embedded data has three levels).
pub fn claims(m: &Measurements) -> Vec<Claim> {
    let t1_rows = TABLE_1_ROWS;
    let fine_only = [
        "TL_SH [57]",
        "NSM [59]",
        "NCA++ [49]",
        "Smooth-AP [2]",
        "ROADMAP [42]",
        "HAPPIER",
    ];
    let rows_of = |table: &str, rows: &[&str], metric: &str| -> Vec<Row> {
        rows.iter()
            .map(|r| row(*r, m.sample(table, r, "", metric)))
            .collect()
    };
    let rows_on = |table: &str, dataset: &str, rows: &[&str], metric: &str| -> Vec<Row> {
        rows.iter()
            .map(|r| row(*r, m.sample_on(table, dataset, r, "", metric)))
            .collect()
    };
    // Table 1's claims are checked on both of its hosted datasets: `<dataset> <key>` labels.
    let deep_keys = |keys: &[&str]| -> Vec<String> {
        [DATASET, DEEP_DATASET]
            .iter()
            .flat_map(|d| keys.iter().map(move |k| format!("{d} {k}")))
            .collect()
    };
    let t3 = |method: &str, metric: &str| m.sample(TABLE_3, method, "", metric);
    let t4_rows = [
        "TL_SH [57]",
        "NSM [59]",
        "NCA++ [49]",
        "Smooth-AP [2]",
        "ROADMAP [42]",
        CSL,
        "HAPPIER",
        "HAPPIER_F",
    ];
    // HAPPIER against CSL on one cell of `table`.
    let over_csl = |table: &str, dataset: Option<&str>, metric: &str| {
        let sample = |method: &str| match dataset {
            Some(d) => m.sample_on(table, d, method, "", metric),
            None => m.sample(table, method, "", metric),
        };
        Claim::greater("", row("HAPPIER", sample("HAPPIER")), row(CSL, sample(CSL)))
    };
    let alphas: Vec<Row> = ALPHAS
        .iter()
        .map(|a| {
            let v = m.sample(FIG_4A, "HAPPIER", &format!("alpha={a}"), "Fine AP");
            row(format!("α={a}"), v)
        })
        .collect();
    let lambda = |l: &str| {
        row(
            format!("λ={l}"),
            m.sample(FIG_4B, "HAPPIER", &format!("lambda={l}"), "H-AP"),
        )
    };
    let t6 = |train: &str, metric: &str| m.sample(TABLE_6, "HAPPIER", train, metric);
    let part = |label: &str, c: Claim| (label.to_string(), c);
    vec![
        Claim::on_each(
            "HAPPIER outperforms every fine-grained and hierarchical method on H-AP, ASI and \
             NDCG (Table 1: +13 H-AP over the best fine-grained method on iNat-base, +4.2 over \
             the best hierarchical one; best on SOP, iNat-base and iNat-full, tied with CSL on \
             iNat-base's ASI at 89.3 and with Σ NSM on iNat-full's NDCG at 93.8; ours: the \
             three-level data beside iNat-base, the six-level data beside iNat-full, SOP's two \
             levels not hosted)",
            &deep_keys(&["H-AP", "ASI", "NDCG"]),
            |k| {
                let (dataset, metric) = split_key(k);
                Claim::best_of("", "HAPPIER", &rows_on(TABLE_1, dataset, &t1_rows, metric))
            },
        ),
        Claim::on_each(
            "HAPPIER gains over CSL on every metric and dataset (Table 1: “Compared to the \
             recent CSL loss [47], we observe a consistent gain over all metrics and datasets, \
             e.g. +6pt on H-AP, +8pt on ASI and +2.6pts on NDCG on SOP”; the table gives +6.6, \
             +8.0 and +3.4 on SOP, +4.2, 0 (89.3 both) and +0.2 on iNat-base, +2.8, +2.3 and \
             +0.8 on iNat-full; ours: H-AP, ASI and NDCG on the three-level data beside \
             iNat-base and the six-level data beside iNat-full, SOP's two levels not hosted)",
            &deep_keys(&["H-AP", "ASI", "NDCG"]),
            |k| {
                let (dataset, metric) = split_key(k);
                over_csl(TABLE_1, Some(dataset), metric)
            },
        ),
        Claim::on_each(
            "Summing a fine-grained loss over the levels improves ASI (Table 1: Σ TL_SH over \
             TL_SH, Σ NSM over NSM, Σ NCA++ over NCA++, on SOP, iNat-base and iNat-full; SOP \
             not hosted)",
            &deep_keys(&["TL_SH", "NSM", "NCA++"]),
            |k| {
                let (dataset, base) = split_key(k);
                let name = |b: &str| {
                    let reference = match b {
                        "NSM" => 59,
                        "NCA++" => 49,
                        _ => 57,
                    };
                    format!("{b} [{reference}]")
                };
                let sample = |method: &str| m.sample_on(TABLE_1, dataset, method, "", "ASI");
                Claim::greater(
                    "",
                    row(format!("Σ {base}"), sample(&format!("Σ {}", name(base)))),
                    row(base, sample(&name(base))),
                )
            },
        ),
        Claim::on_each(
            "HAPPIER outperforms the fine-grained and the hierarchical methods on the DyML \
             benchmarks in mAP and ASI (Table 2: best mAP and ASI on DyML-V, -A and -P; +9 mAP \
             and +10 ASI over the fine-grained methods on DyML-V; ours: the DyML protocol on the \
             embedded data's three levels)",
            &["mAP", "ASI"],
            |k| Claim::best_of("", "HAPPIER", &rows_of(TABLE_2, &t1_rows, k)),
        ),
        Claim::on_each(
            "HAPPIER outperforms CSL on the DyML benchmarks in mAP, ASI and R@1 (Table 2: \
             “HAPPIER also consistently outperforms CSL [47] on its own datasets”; DyML-V 37.0 \
             vs 30.0 mAP, 49.8 vs 43.6 ASI, 89.1 vs 87.1 R@1, and above it on every metric of \
             DyML-A and DyML-P; ours: the DyML protocol on the embedded data's three levels)",
            &["mAP", "ASI", "R@1"],
            |k| over_csl(TABLE_2, None, k),
        ),
        Claim::best_of(
            "HAPPIER is best at the coarse level (Table 3, coarse AP: 88.6 on iNat-base)",
            "HAPPIER",
            &rows_of(TABLE_3, &t1_rows, "Coarse AP"),
        ),
        Claim::best_of(
            "HAPPIER beats the best fine-grained method on fine R@1 (Table 3, iNat-base: 70.7 \
             vs NSM 70.2)",
            "HAPPIER",
            &rows_of(TABLE_3, &fine_only, "Fine R@1"),
        ),
        Claim::on_each(
            "HAPPIER_F (larger α) improves the fine level over HAPPIER (Table 3, iNat-base: fine \
             R@1 71.0 vs 70.7, fine AP 37.8 vs 36.7)",
            &["Fine R@1", "Fine AP"],
            |k| {
                Claim::greater(
                    "",
                    row("HAPPIER_F", t3("HAPPIER_F", k)),
                    row("HAPPIER", t3("HAPPIER", k)),
                )
            },
        ),
        Claim::on_each(
            "On the seven levels of iNat-full, HAPPIER has the best AP at every level from \
             Order upward (Table 4: Order 51.9, Class 81.3, Phylum 89.1, Kingdom 94.4; ours: \
             levels 3–5 of the six-level data, Kingdom not hosted)",
            &["Order AP", "Class AP", "Phylum AP"],
            |k| Claim::best_of("", "HAPPIER", &rows_of(TABLE_4, &t4_rows, k)),
        ),
        Claim::on_each(
            "HAPPIER_F is best at the fine levels of iNat-full: Species, Genus and Family AP \
             (Table 4: 37.6 — tied with NSM —, 38.2, 38.8; ours: levels 0–2 of the six-level \
             data)",
            &["Species AP", "Genus AP", "Family AP"],
            |k| Claim::best_of("", "HAPPIER_F", &rows_of(TABLE_4, &t4_rows, k)),
        ),
        Claim::all_of(
            "HAPPIER outperforms CSL on every semantic level (Tables 3 and 4: “Again, note that \
             HAPPIER outperforms CSL [47] on all semantic levels and datasets on Tabs. 3 and 4, \
             e.g. +5pt on the fine-grained AP (\"Species\") and +3pt on the coarsest AP \
             (\"Kingdom\") on Tab. 4”; iNat-base fine AP 36.7 vs 30.2, coarse AP 88.6 vs 88.5; \
             ours: the AP of each level, fine and coarse on the three-level data beside \
             iNat-base, species … phylum on the six-level data beside iNat-full, SOP and Kingdom \
             not hosted)",
            ["Fine AP", "Coarse AP"]
                .iter()
                .map(|k| (TABLE_3, *k))
                .chain(DEEP_LEVEL_NAMES.iter().map(|k| (TABLE_4, *k)))
                .map(|(table, k)| part(&format!("{table} {k}"), over_csl(table, None, k)))
                .collect(),
        ),
        Claim::greater(
            "The clustering loss improves H-AP (Table 5: +1.3, 53.1 → 54.3)",
            row(
                "L_H-AP + L_clust",
                m.sample(TABLE_5, "HAPPIER", "surrogate=ours;clustering=on", "H-AP"),
            ),
            row(
                "L_H-AP",
                m.sample(TABLE_5, "HAPPIER", "surrogate=ours;clustering=off", "H-AP"),
            ),
        ),
        Claim::greater(
            "Training with H-AP gives the best test H-AP (Table 6)",
            row("train H-AP", t6("train=H-AP", "H-AP")),
            row("train ΣwAP", t6("train=ΣwAP", "H-AP")),
        ),
        Claim::greater(
            "Training with ΣwAP gives the best test ΣwAP (Table 6)",
            row("train ΣwAP", t6("train=ΣwAP", "ΣwAP")),
            row("train H-AP", t6("train=H-AP", "ΣwAP")),
        ),
        Claim::increasing(
            "Increasing α improves the fine-grained AP (Fig. 4a)",
            &alphas,
        ),
        Claim::all_of(
            "A stable H-AP gain for 0 < λ < 0.5 over λ = 0 (Fig. 4b: ours λ = 0.1 and 0.3)",
            ["0.1", "0.3"]
                .iter()
                .map(|l| {
                    part(
                        &format!("λ={l}"),
                        Claim::greater("", lambda(l), lambda("0")),
                    )
                })
                .collect(),
        ),
        Claim::all_of(
            "H-AP drops for λ > 0.5 (Fig. 4b: ours λ = 0.9 below λ = 0.1 and 0.3)",
            ["0.1", "0.3"]
                .iter()
                .map(|l| {
                    part(
                        &format!("λ={l}"),
                        Claim::greater("", lambda(l), lambda("0.9")),
                    )
                })
                .collect(),
        ),
    ]
}

/// The figures: Fig. 4a (fine AP against α) and Fig. 4b (H-AP against λ), the paper's points
/// (iNat-base, two per sweep, from its tables) beside ours, and the test H-AP of Table 1's
/// methods over training.
pub fn figures(m: &Measurements, tables: &[super::ReproducedTable]) -> Result<Vec<super::Figure>> {
    use super::publish::{sweep_of, training_curves};
    use crate::report::sweep;
    Ok(vec![
        super::Figure {
            stem: "happier_alpha".into(),
            chart: sweep(
                "HAPPIER Fig. 4a: fine AP against α",
                "α",
                "Fine AP (%)",
                &[sweep_of(tables, FIG_4A, "Fine AP", DATASET, "alpha")?],
                false,
            )?,
        },
        super::Figure {
            stem: "happier_lambda".into(),
            chart: sweep(
                "HAPPIER Fig. 4b: H-AP against λ",
                "λ",
                "H-AP (%)",
                &[sweep_of(tables, FIG_4B, "H-AP", DATASET, "lambda")?],
                false,
            )?,
        },
        super::Figure {
            stem: "happier_training".into(),
            chart: training_curves(
                m,
                TABLE_1,
                "H-AP",
                None,
                "HAPPIER Table 1 methods: test H-AP during training",
            )?,
        },
    ])
}

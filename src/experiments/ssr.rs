//! SSR (Shen et al., NeurIPS 2021): transductive few-shot classification (Table 2) and
//! re-ranking for retrieval (Table 1), on frozen features of the embedded shapes dataset.
//!
//! What runs at the `quick`, `standard` and `tiny` scales (recipe `configs/experiments/ssr.toml`,
//! [`SsrRecipe`]):
//!
//! 1. The backbone: the small CNN trained with Smooth-AP on the base classes (64% of the fine
//!    classes; 16% validation, 20% novel, [`crate::fewshot::all_split_features`]), then frozen;
//!    every split embedded once. Where the scale has `[pretraining.<scale>]` (standard, tiny),
//!    every replicate's backbone fine-tunes one network pretrained on other classes
//!    ([`SsrRecipe::pretraining`]), the training papers' own pretrained backbone. SSR's
//!    backbones are cosine classifiers on mini-ImageNet /
//!    tiered-ImageNet / CIFAR-FS; ours stands beside the paper's CIFAR-FS Conv-4-64 column
//!    (32 × 32 images, a 4-block CNN) in Table 2 and beside CUB with the GL feature in Table 1
//!    (a fine-grained test split of unseen classes, every image a query against the rest).
//! 2. SSR meta-trained on the base classes' features ([`crate::rerank::ssr::train`]) for each
//!    candidate `λ` (and `k` for retrieval) of the recipe; after every stage of the schedule
//!    (`T` = 1, 2, 3) the model is scored on the validation classes (few-shot: mean accuracy
//!    over fixed validation episodes; retrieval: mAP@R), and the best `(λ, k, T)` is kept —
//!    nothing is chosen on the novel classes.
//! 3. Table 2: 5-way 1-shot and 5-shot episodes (15 queries per class) of the novel classes;
//!    "Baseline" = nearest prototype by cosine, "+ k-reciprocal \[75\]" = k-reciprocal against
//!    the prototypes with the recipe's (k1, k2, λ) (quick: Zhong et al.'s default (20, 6, 0.3);
//!    not tuned on the test episodes, unlike SSR's script), "+ Ours" = SSR. Accuracy and 95% half-width.
//! 4. Table 1: every novel image a query against the others; "Feat. only", "AQE \[9\]",
//!    "k-reciprocal \[75\] †" and each "+ SSR" (SSR applied to the top-k of that list, with the
//!    original features). mAP@R (the paper's metric) and R@1 (ours only). One more row of
//!    ours, [`KR_INPUT_ROW`]: SSR reading Eq. 9's `D^t = 2α(1 − S^t) + (1 − α)J` (Sec. 2.3; the
//!    authors' code never does this), with k-reciprocal's `(k1, k2)` and `α` = its `λ`,
//!    applied to the top-k of the features.
//! 5. Tables 3 and 4 (the ablations; the paper: CARS with Group-Loss features and N = 100, and
//!    mini-ImageNet WRN-28-10 1-shot; ours stand beside those columns): the "Baseline
//!    (features)" row is Table 1's / Table 2's baseline on the same test set; every other row
//!    is SSR with one switch of [`SsrConfig`] changed ([`retrieval_ablation_rows`],
//!    [`few_shot_ablation_rows`]), meta-trained with the recipe's ablation schedule
//!    ([`AblationRecipe`]) at the `λ` (and `k`) that Tables 1–2 selected — re-selecting `λ`
//!    per row would multiply the cost by the grid size; the "w.o feat. update" rows, whose
//!    step acts on another scale, choose theirs from the grid ([`ablation_lambdas`]) — with
//!    `T` chosen on the validation classes after each stage, as there. "Ours" is retrained
//!    with the same schedule so that every row is trained alike. The row "w.o feat. update"
//!    adds `λG` to `S` (Eq. 2 with the feature step's scale, see [`UpdateSpace::Similarity`]).
//!
//! At the `paper` scale nothing is trained here but SSR: the recipe's `[paper.features]`
//! ([`super::ssr_features`]) names frozen features on disk — the few-shot set of Table 2
//! (e.g. mini-ImageNet, WRN-28-10), the retrieval set of a mAP@R column of Table 1 (e.g. CUB,
//! GL) and the revisited landmarks (rOxford5k / rParis6k, Medium and Hard mAP, SSR meta-trained
//! on the training landmarks' features) — and steps 2–4 run on them, filling the paper's own
//! columns.

use super::claim::{row, Claim, Row};
use super::ssr_features::{Column, LandmarkSet, Split, SsrFeatureSets};
use super::table::{data_name, describe_recipe, Measurements};
use super::Scale;
use crate::error::{Error, Result};
use crate::fewshot::prototype::PrototypeClassifier;
use crate::fewshot::{all_split_features, EpisodeClassifier, QuickBackboneConfig};
use crate::hierarchy::Labels;
use crate::losses::smooth_ap::SmoothAp;
use crate::metrics::fewshot::{accuracy_interval, AccuracyInterval};
use crate::metrics::revisited::{Protocol, REVISITOP_KAPPAS};
use crate::report::{Measured, Provenance, Unit};
use crate::rerank::k_reciprocal::KReciprocal;
use crate::rerank::k_reciprocal::KReciprocalClassifier;
use crate::rerank::query_expansion::QueryExpansion;
use crate::rerank::ssr::select::{select, Selected};
use crate::rerank::ssr::{
    ColumnOrder, Decomposition, FewShotTasks, MetaTrainConfig, NodeGroup, RetrievalTasks,
    SsrClassifier, SsrConfig, SsrInput, SsrModel, SsrRanking, SupportNodes, Task, TaskSource,
    UpdateSpace,
};
use crate::rerank::{self, CosineRanking, Reranker, TopN};
use crate::retrieval::EvalOptions;
use crate::samplers::episodes::EpisodeConfig;
use crate::stats::Units;
use crate::train::TrainConfig;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The paper's key in `paper_tables/published/` and `configs/experiments/`.
pub const PAPER: &str = "ssr";
/// Table 1 (retrieval, mAP@R).
pub const TABLE_RETRIEVAL: &str = "Table 1";
/// Table 2 (transductive few-shot accuracy).
pub const TABLE_FEWSHOT: &str = "Table 2";
/// Table 3 (retrieval ablation, mAP@R).
pub const TABLE_RETRIEVAL_ABLATION: &str = "Table 3";
/// Table 4 (few-shot ablation, 1-shot accuracy).
pub const TABLE_FEWSHOT_ABLATION: &str = "Table 4";
/// The paper's dataset and setting of Table 3 (CARS, Group-Loss features, N = 100).
pub const RETRIEVAL_ABLATION_DATASET: &str = "CARS";
/// See [`RETRIEVAL_ABLATION_DATASET`].
pub const RETRIEVAL_ABLATION_SETTING: &str = "feature=GL;N=100";
/// The paper's dataset and backbone of Table 4 (mini-ImageNet, WRN-28-10).
pub const FEWSHOT_ABLATION_DATASET: &str = "mini-ImageNet";
/// See [`FEWSHOT_ABLATION_DATASET`].
pub const FEWSHOT_ABLATION_SETTING: &str = "backbone=WRN-28-10";
/// Table 1's row of SSR reading Eq. 9's `D^t` (Sec. 2.3; ours only: the paper prints none).
pub const KR_INPUT_ROW: &str = "Feat + SSR, k-reciprocal input (Eq. 9)";

/// A row of an ablation table: the method, the paper's setting, and the change to SSR's
/// configuration.
type AblationRow = (&'static str, &'static str, fn(&mut SsrConfig));

/// SSR Table 3's rows (after the baseline): `M_i`'s rows, the local sort, the subgraphs and
/// the feature update.
pub fn retrieval_ablation_rows() -> Vec<AblationRow> {
    use NodeGroup::*;
    vec![
        ("Ours (sample and query)", "", |_| {}),
        ("w.o sample", "", |c| c.rows = Some(vec![Query])),
        ("w.o query", "", |c| c.rows = Some(vec![Sample])),
        // The text: "considering the full graph" — every node's row.
        ("w.o other", "", |c| {
            c.rows = Some(vec![Sample, Query, References])
        }),
        ("w.o local sort", "", |c| c.order = ColumnOrder::Shared),
        ("w.o subgraph", "", |c| {
            c.decomposition = Decomposition::WholeGraph
        }),
        ("w.o feat. update", "", |c| {
            c.update_space = UpdateSpace::Similarity
        }),
    ]
}

/// SSR Table 4's rows (after the baseline), method `SSR` with the paper's setting suffix:
/// `M_i`'s rows × columns, then the ablations.
pub fn few_shot_ablation_rows() -> Vec<AblationRow> {
    use NodeGroup::*;
    vec![
        ("SSR", "rows=sample+S;columns=S+Q", |_| {}),
        ("SSR", "rows=sample+S+Q;columns=S+Q", |c| {
            c.rows = Some(vec![Sample, Support, Query])
        }),
        ("SSR", "rows=S;columns=S+Q", |c| {
            c.rows = Some(vec![Support])
        }),
        ("SSR", "rows=sample;columns=S+Q", |c| {
            c.rows = Some(vec![Sample])
        }),
        ("SSR", "rows=sample+S;columns=S", |c| {
            c.columns = Some(vec![Support])
        }),
        ("SSR", "rows=sample+S;columns=Q", |c| {
            c.columns = Some(vec![Query])
        }),
        ("SSR", "ablation=w.o local sort", |c| {
            c.order = ColumnOrder::Shared
        }),
        ("SSR", "ablation=w.o subgraph", |c| {
            c.decomposition = Decomposition::WholeGraph
        }),
        ("SSR", "ablation=w.o feat. update", |c| {
            c.update_space = UpdateSpace::Similarity
        }),
    ]
}
/// The step sizes an ablation row is meta-trained with: Tables 1–2's selected `λ`, except for
/// the rows that add `λG` to the similarities (Eq. 2, "w.o feat. update"), which choose theirs on
/// the validation classes from the recipe's grid. Eq. 2 moves `S` directly, at another scale than
/// the feature step of Eqs. 3–4, and its gradient reaches the MLP scaled by `λ`: on the notebook's
/// toy 5-way 1-shot episodes (05_ssr), meta-trained the same way, the feature update gains 12.0
/// points over the baseline at λ = 0.002, the similarity update 1.4 at λ = 0.002 and 7.9 at 0.01 —
/// at quick, with Table 2's λ, the row was bit-identical to the baseline in every replicate.
pub fn ablation_lambdas(config: &SsrConfig, selected: f64, grid: &[f64]) -> Vec<f64> {
    if config.update_space == UpdateSpace::Similarity {
        grid.to_vec()
    } else {
        vec![selected]
    }
}

/// How an ablation row's λ was set, for its caption.
fn lambda_what(lambdas: &[f64], fixed: &str) -> String {
    if lambdas.len() == 1 {
        format!("λ fixed to {fixed}")
    } else {
        format!("λ chosen on validation from {lambdas:?}: Eq. 2's scale differs")
    }
}

/// The paper's dataset column our retrieval values stand beside.
pub const RETRIEVAL_DATASET: &str = "CUB";
/// The paper's feature (setting) our retrieval values stand beside.
pub const RETRIEVAL_SETTING: &str = "feature=GL";
/// The paper's dataset column our few-shot values stand beside.
pub const FEWSHOT_DATASET: &str = "CIFAR-FS";
/// The paper's backbone (setting) our few-shot values stand beside.
pub const FEWSHOT_SETTING: &str = "backbone=Conv-4-64";

/// SSR's recipe: one [`SsrScaleRecipe`] per scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsrRecipe {
    /// Replicates per scale (`[seeds]`): replicate `i` trains the backbone with its seed + `i`
    /// and meta-trains SSR with seeds offset by `i` ([`REPLICATE_SEED_STRIDE`]), on the same
    /// class split, episodes and queries, so every row is scored on the same test units.
    #[serde(default)]
    pub seeds: super::SeedCounts,
    /// CI scale.
    pub tiny: SsrScaleRecipe,
    /// CPU scale.
    pub quick: SsrScaleRecipe,
    /// The quick data with a converged backbone and more replicates (absent: not defined).
    #[serde(default)]
    pub standard: Option<SsrScaleRecipe>,
    /// The paper's scale (absent: the paper's features are not available here).
    #[serde(default)]
    pub paper: Option<SsrScaleRecipe>,
    /// `[pretraining.<scale>]`: changes over the scale's `[backbone]` that pretrain the network
    /// every replicate's backbone fine-tunes ([`Self::pretraining`]), as for the training papers
    /// ([`super::recipe::Pretraining`]); a scale without one trains its backbone from random
    /// weights.
    #[serde(default)]
    pub pretraining: super::recipe::Pretraining,
}

/// Everything one scale of the SSR experiments runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsrScaleRecipe {
    /// The backbone's data, network and training (the embedded dataset's classes are split
    /// 64/16/20 into base / validation / novel). Exactly one of `backbone` and `features`.
    #[serde(default)]
    pub backbone: Option<TrainConfig>,
    /// Frozen features from files instead of a backbone trained here (the paper's scale,
    /// [`super::ssr_features`]).
    #[serde(default)]
    pub features: Option<SsrFeatureSets>,
    /// Seed of the class split.
    #[serde(default)]
    pub split_seed: u64,
    /// Table 2.
    pub few_shot: FewShotRecipe,
    /// Table 1.
    pub retrieval: RetrievalRecipe,
}

/// The few-shot part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FewShotRecipe {
    /// N of N-way (paper: 5).
    pub ways: usize,
    /// Queries per class (code: 15).
    pub queries: usize,
    /// Shots evaluated (paper: 1 and 5); SSR is trained for each.
    pub shots: Vec<usize>,
    /// Test episodes per setting (paper: 2,000).
    pub test_episodes: usize,
    /// Fixed validation episodes (code: 1,000).
    pub val_episodes: usize,
    /// SSR's hyperparameters (`lambda` and `steps` are replaced by the selection).
    pub ssr: SsrConfig,
    /// Candidate step sizes `λ`.
    pub lambdas: Vec<f64>,
    /// Meta-training schedule (one stage per `T`).
    pub train: MetaTrainConfig,
    /// Prototypes (the code) or shots (the paper) as support nodes.
    #[serde(default)]
    pub support_nodes: SupportNodes,
    /// The "+ k-reciprocal" row's `(k1, k2, λ)` (Zhong et al.'s default (20, 6, 0.3)).
    #[serde(default = "default_kr")]
    pub k_reciprocal: (usize, usize, f64),
    /// Table 4 (the `M_i` variants and ablations); absent: not measured.
    #[serde(default)]
    pub ablation: Option<AblationRecipe>,
    /// Seed of SSR's initialisation and of the episodes.
    #[serde(default)]
    pub seed: u64,
}

/// The ablation tables (SSR Tables 3 and 4): every row is an SSR model meta-trained with
/// `train` on the base classes at the `λ` (and `k`) selected for Table 1 / Table 2, its `T`
/// chosen on the validation classes after each stage as there, and evaluated on the same
/// novel-class test set as Tables 1–2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AblationRecipe {
    /// The meta-training schedule of every row (may be shorter than Tables 1–2's to keep the
    /// scale affordable; "Ours" is retrained with it so that every row is trained alike).
    pub train: MetaTrainConfig,
    /// Shots of the few-shot ablation (Table 4: 1); must be one of `few_shot.shots`.
    #[serde(default = "one")]
    pub shots: usize,
}

fn one() -> usize {
    1
}

fn default_kr() -> (usize, usize, f64) {
    (20, 6, 0.3)
}

/// The retrieval part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalRecipe {
    /// Candidate `k` (references re-ranked per query; the paper's N − 1).
    pub k: Vec<usize>,
    /// Candidate step sizes `λ`.
    pub lambdas: Vec<f64>,
    /// SSR's hyperparameters (`lambda` and `steps` are replaced by the selection).
    pub ssr: SsrConfig,
    /// Meta-training schedule.
    pub train: MetaTrainConfig,
    /// Random base images ranked per training query (code: 1,000; absent: all).
    #[serde(default)]
    pub pool: Option<usize>,
    /// Hard-example filter: at least this many positives in the top k (code: > 5).
    pub min_positives: usize,
    /// Hard-example filter: initial AP of the top k below this (code: 0.8).
    pub max_ap: f64,
    /// Neighbours of AQE (code sweeps 1–9).
    pub aqe_k: usize,
    /// k-reciprocal's `k1`.
    pub k1: usize,
    /// k-reciprocal's `k2`.
    pub k2: usize,
    /// k-reciprocal's `λ` (weight of the original distance).
    pub kr_lambda: f64,
    /// Table 3 (the `M_i` row variants and ablations) and Table 1's Sec. 2.3 row (SSR reading
    /// Eq. 9's `D^t` with `α = kr_lambda`, `k1`, `k2`); absent: not measured.
    #[serde(default)]
    pub ablation: Option<AblationRecipe>,
    /// Seed of SSR's initialisation and of the training graphs.
    #[serde(default)]
    pub seed: u64,
}

impl SsrRecipe {
    /// Reads `configs/experiments/ssr.toml`-like files; errors name the file and key.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_toml_file_with(path, "")
    }

    /// [`Self::from_toml_file`] with `changes` merged over the file
    /// ([`super::recipe::merge_toml`]).
    pub fn from_toml_file_with(path: impl AsRef<Path>, changes: &str) -> Result<Self> {
        let mut recipe: SsrRecipe = super::recipe::read_per_scale(
            path.as_ref(),
            changes,
            |r: &SsrRecipe| {
                [
                    Some(&r.tiny),
                    Some(&r.quick),
                    r.standard.as_ref(),
                    r.paper.as_ref(),
                ]
            },
            SsrScaleRecipe::validate,
        )?;
        super::recipe::resolve_extends(path.as_ref(), &mut recipe.pretraining)?;
        recipe
            .seeds
            .validate()
            .map_err(|e| Error::invalid(path.as_ref().display().to_string(), e.to_string()))?;
        super::recipe::check_pretraining(path.as_ref(), |scale| recipe.pretraining(scale))?;
        Ok(recipe)
    }

    /// The recipe that pretrains the backbone every replicate of `scale` fine-tunes: the
    /// scale's `[backbone]` with `[pretraining.<scale>]` merged over it; `None` without such a
    /// section (or for a scale this recipe does not define); an error for a scale that reads
    /// frozen features instead of training a backbone.
    pub fn pretraining(&self, scale: Scale) -> Result<Option<TrainConfig>> {
        let Some(changes) = self.pretraining.of(scale).as_ref() else {
            return Ok(None);
        };
        let recipe = self.at(scale)?;
        let backbone = recipe.backbone.as_ref().ok_or_else(|| {
            Error::invalid(
                "pretraining",
                "this scale reads frozen [features]: there is no backbone to pretrain",
            )
        })?;
        super::recipe::pretraining_over(backbone, changes).map(Some)
    }

    /// The recipe under the repository root.
    pub fn for_root(root: &Path) -> Result<Self> {
        Self::for_root_with(root, "")
    }

    /// [`Self::for_root`] with `changes` merged over the file.
    pub fn for_root_with(root: &Path, changes: &str) -> Result<Self> {
        Self::from_toml_file_with(super::recipe::recipe_path(root, PAPER), changes)
    }

    /// The recipe of `scale`.
    pub fn at(&self, scale: Scale) -> Result<SsrScaleRecipe> {
        match scale {
            Scale::Tiny => Ok(self.tiny.clone()),
            Scale::Quick => Ok(self.quick.clone()),
            Scale::Standard => self.standard.clone().ok_or_else(|| {
                Error::invalid(
                    "scale",
                    "the SSR recipe has no [standard] section; run the tiny or quick scale",
                )
            }),
            Scale::Paper => self.paper.clone().ok_or_else(|| {
                Error::invalid(
                    "scale",
                    "the SSR recipe has no [paper] section (the paper's pre-trained features are \
                     not available here); run the tiny or quick scale",
                )
            }),
        }
    }
}

impl SsrScaleRecipe {
    /// Errors naming the first invalid field.
    pub fn validate(&self) -> Result<()> {
        match (&self.backbone, &self.features) {
            (Some(b), None) => b.validate()?,
            (None, Some(f)) => f.validate()?,
            _ => {
                return Err(Error::invalid(
                    "backbone",
                    "give exactly one of [backbone] (train one on the embedded dataset) and \
                     [features] (frozen features from files)",
                ))
            }
        }
        let f = &self.few_shot;
        if f.ways < 2 || f.queries == 0 || f.shots.is_empty() || f.shots.contains(&0) {
            return Err(Error::invalid(
                "few_shot",
                "ways ≥ 2, queries ≥ 1 and a non-empty list of shots ≥ 1",
            ));
        }
        if f.test_episodes == 0 || f.val_episodes == 0 {
            return Err(Error::invalid(
                "few_shot",
                "test_episodes and val_episodes ≥ 1",
            ));
        }
        for (what, l) in [
            ("few_shot.lambdas", &f.lambdas),
            ("retrieval.lambdas", &self.retrieval.lambdas),
        ] {
            if l.is_empty() || l.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(Error::invalid(what, "list at least one finite λ ≥ 0"));
            }
        }
        f.ssr.validate()?;
        f.train.validate()?;
        let r = &self.retrieval;
        if r.k.is_empty() || r.k.contains(&0) {
            return Err(Error::invalid("retrieval.k", "list at least one k ≥ 1"));
        }
        if r.aqe_k == 0 {
            return Err(Error::invalid("retrieval.aqe_k", "must be ≥ 1"));
        }
        r.ssr.validate()?;
        r.train.validate()?;
        if let Some(a) = &f.ablation {
            a.train.validate()?;
            if !f.shots.contains(&a.shots) {
                return Err(Error::invalid(
                    "few_shot.ablation.shots",
                    format!("{} is not one of few_shot.shots {:?}", a.shots, f.shots),
                ));
            }
        }
        if let Some(a) = &r.ablation {
            a.train.validate()?;
        }
        Ok(())
    }
}

/// The episodes' configuration.
fn episodes(f: &FewShotRecipe, shots: usize) -> EpisodeConfig {
    EpisodeConfig {
        ways: f.ways,
        shots,
        queries: f.queries,
        level: 0,
        shuffle_queries: true,
    }
}

/// SSR's experiments ([`super::Experiment`]).
#[derive(Debug, Clone, Copy)]
pub struct Ssr;

/// SSR's entry of the paper registry.
pub const EXPERIMENT: Ssr = Ssr;

impl super::Experiment for Ssr {
    fn key(&self) -> &'static str {
        PAPER
    }

    fn name(&self) -> &'static str {
        "SSR"
    }

    fn measure(&self, cx: &super::Context) -> Result<Measurements> {
        // Only the pretraining goes through the runner (cached; the same key as the training
        // papers' pretraining, so all five share one backbone);
        // the backbones and the meta-training run in `measure` (the selected modules are saved
        // beside the run cache).
        measure_in(cx.root, cx.runner, cx.scale, cx.changes)
    }

    fn claims(&self, _cx: &super::Context, m: &Measurements) -> Result<Vec<super::Claim>> {
        Ok(claims(m))
    }

    fn figures(
        &self,
        m: &Measurements,
        tables: &[super::ReproducedTable],
    ) -> Result<Vec<super::Figure>> {
        let _ = tables;
        figures(m)
    }
}

/// Runs both tables at `scale` (recipe under `root`), once per replicate of the recipe's
/// `[seeds]`, and returns our cells ([`merge_replicates`]). Except at the tiny scale (which
/// tests run concurrently), the selected SSR modules are saved under
/// `root/target/rankwise-runs/<scale>/ssr/` (replicate `i ≥ 1` under `replicate_<i>/`).
/// A `[pretraining.<scale>]` backbone is trained without a cache (the system's temporary
/// folder); [`measure_in`] takes the runner whose cache keeps it.
pub fn measure(root: &Path, scale: Scale) -> Result<Measurements> {
    measure_with(root, scale, "")
}

/// [`measure`] with `changes` (TOML) merged over the recipe file.
pub fn measure_with(root: &Path, scale: Scale, changes: &str) -> Result<Measurements> {
    measure_in(root, &super::Runner::new(None, false), scale, changes)
}

/// [`measure_with`], the scale's pretrained backbone (if its recipe has `[pretraining.<scale>]`)
/// trained once by `runner` ([`super::Runner::pretrained_backbone`]) and fine-tuned by every
/// replicate's backbone, as the papers' backbones start from the same ImageNet weights.
pub fn measure_in(
    root: &Path,
    runner: &super::Runner,
    scale: Scale,
    changes: &str,
) -> Result<Measurements> {
    // The replicates train here, outside the run cache, by this build: beside a runner that
    // reads other codes' runs they would mix codes in one table.
    if !runner.reads_this_build_only() {
        return Err(Error::invalid(
            "SSR",
            format!(
                "its replicates' feature networks and meta-training run inside the measurement, \
                 not from the run cache, so they cannot be read back as runs of run code {}; \
                 measure SSR with this build's code ({})",
                runner.run_code(),
                super::runs::RUN_CODE
            ),
        ));
    }
    let all = SsrRecipe::for_root_with(root, changes)?;
    let mut recipe = all.at(scale)?;
    let pretrained_by = match (all.pretraining(scale)?, recipe.backbone.as_mut()) {
        (Some(p), Some(backbone)) => {
            let (weights, by) = super::table::pretrained(runner, p)?;
            backbone.pretrained = Some(weights);
            Some(by)
        }
        _ => None,
    };
    let dir = root
        .join("target")
        .join("rankwise-runs")
        .join(scale.as_str())
        .join(PAPER);
    let replicates = all.seeds.count(scale);
    let mut parts = Vec::with_capacity(replicates);
    for i in 0..replicates {
        let dir = if i == 0 {
            dir.clone()
        } else {
            dir.join(format!("replicate_{i}"))
        };
        let checkpoints = (scale != Scale::Tiny).then_some(dir.as_path());
        if replicates > 1 {
            println!("SSR replicate {} of {replicates}:", i + 1);
        }
        parts.push(measure_replicate(
            root,
            &recipe,
            scale,
            i,
            checkpoints,
            pretrained_by.as_deref(),
        )?);
    }
    let mut m = merge_replicates(parts)?;
    m.looks = all.seeds.looks(scale);
    Ok(m)
}

/// Offset between the meta-training seeds of two replicates: replicate `i` meta-trains with
/// the recipe's seed + `i ·` this (far from the episodes' seed + 1 and + 2, which every
/// replicate shares).
pub const REPLICATE_SEED_STRIDE: u64 = 1_000;

/// The replicates' cells as one set: each cell on test units keeps every replicate's
/// per-unit values (its [`crate::stats::Units`] records which replicate each
/// value belongs to), any other cell keeps one value per replicate; the value is the mean over
/// replicates, and the provenance names the backbone seeds and each replicate's selection.
/// Errors if the replicates' cells differ in their keys (they run the same code on the same
/// recipe, so they cannot, short of a bug).
pub fn merge_replicates(parts: Vec<Measurements>) -> Result<Measurements> {
    let mut parts = parts.into_iter();
    let Some(first) = parts.next() else {
        return Err(Error::invalid("seeds", "no replicate to merge"));
    };
    let rest: Vec<Measurements> = parts.collect();
    if rest.is_empty() {
        return Ok(first);
    }
    let mut out = Measurements::default();
    for (j, c) in first.cells.iter().enumerate() {
        let mut cell = c.clone();
        let mut values = c.samples.clone();
        let mut replicate = match &c.units {
            Some(u) => u.replicate.clone(),
            None => vec![0; c.samples.len()],
        };
        let mut details = vec![c.provenance.detail.clone()];
        for (i, part) in rest.iter().enumerate() {
            let other = part.cells.get(j).filter(|o| {
                (&o.table, &o.method, &o.dataset, &o.metric, &o.setting)
                    == (&c.table, &c.method, &c.dataset, &c.metric, &c.setting)
            });
            let Some(other) = other else {
                return Err(Error::invalid(
                    "seeds",
                    format!(
                        "replicate {} has no cell {} / {} / {} / {} like replicate 0",
                        i + 1,
                        c.table,
                        c.method,
                        c.metric,
                        c.setting
                    ),
                ));
            };
            values.extend_from_slice(&other.samples);
            replicate.extend(std::iter::repeat_n(i + 1, other.samples.len()));
            details.push(other.provenance.detail.clone());
        }
        match &mut cell.units {
            Some(u) => {
                u.replicate = replicate;
                cell.samples = values;
            }
            // One value per replicate: the replicates are the seeds.
            None => cell.samples = crate::stats::replicate_means(&replicate, &values),
        }
        cell.value = cell.sample().mean();
        details.dedup();
        cell.provenance.detail = if details.len() == 1 {
            details.remove(0)
        } else {
            details
                .iter()
                .enumerate()
                .map(|(i, d)| format!("replicate {i}: {d}"))
                .collect::<Vec<_>>()
                .join(" · ")
        };
        out.cells.push(cell);
    }
    Ok(out)
}

/// Runs both tables with an explicit recipe, relative feature paths resolved against the
/// current directory; see [`measure_recipe_in`].
pub fn measure_recipe(
    recipe: &SsrScaleRecipe,
    scale: Scale,
    checkpoints: Option<&Path>,
) -> Result<Measurements> {
    measure_recipe_in(Path::new(""), recipe, scale, checkpoints)
}

/// Where one table's rows come from and where they go.
struct Source<'a> {
    scale: Scale,
    /// The dataset, for the provenance.
    data: String,
    /// How the features were made, for the provenance.
    features: String,
    /// The paper's column.
    column: Column,
    /// The column of the ablation table (Table 3 or 4) its rows stand beside: on the embedded
    /// data, the paper's (CARS, mini-ImageNet) as for every quick-scale table; with a
    /// feature set, `None`: the set's own column (for Table 3 with `;N=<k + 1>` appended,
    /// as the paper's settings), so paper values stand only beside the same dataset.
    ablation: Option<Column>,
    /// Where the selected SSR modules are saved.
    checkpoints: Option<&'a Path>,
    /// Added to the few-shot recipe's seed of SSR's initialisation and training episodes (not
    /// to the validation and test episodes' seeds): a replicate of the meta-training.
    meta_seed_offset: u64,
}

/// Runs the tables of `recipe`: with a `backbone`, both tables on its frozen features of the
/// embedded dataset; with `features`, each listed feature set (relative paths against `root`).
/// Saves the selected SSR modules (`fewshot_<K>shot.safetensors`, `retrieval.safetensors`,
/// `landmarks.safetensors`, atomically) under `checkpoints` if given. One replicate (the
/// recipe's own seeds); [`measure`] runs the recipe's `[seeds]`.
pub fn measure_recipe_in(
    root: &Path,
    recipe: &SsrScaleRecipe,
    scale: Scale,
    checkpoints: Option<&Path>,
) -> Result<Measurements> {
    measure_replicate(root, recipe, scale, 0, checkpoints, None)
}

/// [`measure_recipe_in`] for replicate `replicate`: the backbone's seed + `replicate`, SSR's
/// meta-training seeds + `replicate ·` [`REPLICATE_SEED_STRIDE`]; the split, the episodes and
/// the queries are the recipe's. `pretrained_by` says in a few words how the backbone's
/// `pretrained` weights were made ([`super::table::describe_pretraining`]), for the provenance.
fn measure_replicate(
    root: &Path,
    recipe: &SsrScaleRecipe,
    scale: Scale,
    replicate: usize,
    checkpoints: Option<&Path>,
    pretrained_by: Option<&str>,
) -> Result<Measurements> {
    if let Some(dir) = checkpoints {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    recipe.validate()?;
    // Retrieval's seed drives only the meta-training (its test queries are every novel
    // image); few-shot's also draws the episodes, so its offset goes through `Source`.
    let mut recipe = recipe.clone();
    recipe.retrieval.seed += replicate as u64 * REPLICATE_SEED_STRIDE;
    let recipe = &recipe;
    let mut out = Measurements::default();
    let source =
        |set_column: Column, ablation: Option<Column>, data: String, features: String| Source {
            scale,
            data,
            features,
            column: set_column,
            ablation,
            checkpoints,
            meta_seed_offset: replicate as u64 * REPLICATE_SEED_STRIDE,
        };
    match (&recipe.backbone, &recipe.features) {
        (Some(backbone), _) => {
            let mut backbone = backbone.clone();
            backbone.seed += replicate as u64;
            let backbone = &backbone;
            let config = QuickBackboneConfig {
                train: backbone.clone(),
                split_seed: recipe.split_seed,
                ..QuickBackboneConfig::default()
            };
            let feats = all_split_features(&config, &SmoothAp::default())?;
            let data = data_name(backbone);
            let start = match (pretrained_by, &backbone.pretrained) {
                (Some(by), _) => format!(", from a backbone pretrained by {by}"),
                (None, Some(weights)) => format!(", from the weights {}", weights.display()),
                (None, None) => String::new(),
            };
            let features = format!(
                "backbone {} trained with Smooth-AP on the base classes{start}",
                describe_recipe(backbone)
            );
            let column = |dataset: &str, setting: &str| Column {
                dataset: dataset.into(),
                setting: setting.into(),
            };
            few_shot(
                &recipe.few_shot,
                &feats,
                &source(
                    column(FEWSHOT_DATASET, FEWSHOT_SETTING),
                    Some(column(FEWSHOT_ABLATION_DATASET, FEWSHOT_ABLATION_SETTING)),
                    data.clone(),
                    features.clone(),
                ),
                &mut out,
            )?;
            retrieval(
                &recipe.retrieval,
                &feats,
                &source(
                    column(RETRIEVAL_DATASET, RETRIEVAL_SETTING),
                    Some(column(
                        RETRIEVAL_ABLATION_DATASET,
                        RETRIEVAL_ABLATION_SETTING,
                    )),
                    data,
                    features,
                ),
                &mut out,
            )?;
        }
        (None, Some(sets)) => {
            let named = |c: &Column, describe: &str| {
                source(c.clone(), None, c.dataset.clone(), describe.to_string())
            };
            if let Some(set) = &sets.few_shot {
                let feats = set.read(root)?;
                few_shot(
                    &recipe.few_shot,
                    &feats,
                    &named(&set.column, &set.describe),
                    &mut out,
                )?;
            }
            if let Some(set) = &sets.retrieval {
                let feats = set.read(root)?;
                retrieval(
                    &recipe.retrieval,
                    &feats,
                    &named(&set.column, &set.describe),
                    &mut out,
                )?;
            }
            if let Some(set) = &sets.landmarks {
                landmarks(&recipe.retrieval, set, root, scale, checkpoints, &mut out)?;
            }
        }
        (None, None) => {
            return Err(Error::invalid(
                "backbone",
                "the recipe has neither [backbone] nor [features]",
            ))
        }
    }
    Ok(out)
}

fn few_shot(
    f: &FewShotRecipe,
    feats: &crate::fewshot::SplitFeatures,
    src: &Source,
    out: &mut Measurements,
) -> Result<()> {
    let (base_x, base_y) = &feats.base;
    let (val_x, val_y) = &feats.val;
    let (test_x, test_y) = &feats.novel;
    let meta_seed = f.seed + src.meta_seed_offset;
    for &shots in &f.shots {
        let ep = episodes(f, shots);
        let supports = match f.support_nodes {
            SupportNodes::Prototypes => f.ways,
            SupportNodes::Shots => f.ways * shots,
        };
        let candidates: Vec<(f64, usize)> = f.lambdas.iter().map(|&l| (l, 0)).collect();
        let val_ep = ep.clone();
        let val_base = crate::fewshot::evaluate(
            &PrototypeClassifier::default(),
            val_x,
            val_y,
            &val_ep,
            f.val_episodes,
            f.seed + 1,
        )?;
        println!(
            "  {shots}-shot validation accuracy of the baseline: {:.4}",
            val_base.mean
        );
        let make_task = |_: usize| Task::FewShot {
            supports,
            queries: f.ways * f.queries,
        };
        let make_tasks = |_: usize| -> Result<Box<dyn TaskSource>> {
            Ok(Box::new(FewShotTasks::new(
                base_x,
                base_y,
                &ep,
                f.support_nodes,
                meta_seed,
            )?))
        };
        let validate = |model: &SsrModel| -> Result<f64> {
            let c = SsrClassifier {
                model,
                support_nodes: f.support_nodes,
            };
            Ok(
                crate::fewshot::evaluate(&c, val_x, val_y, &val_ep, f.val_episodes, f.seed + 1)?
                    .mean,
            )
        };
        let selected = select(
            &candidates,
            &f.ssr,
            &f.train,
            meta_seed,
            &make_task,
            &make_tasks,
            &validate,
        )?;
        if let Some(dir) = src.checkpoints {
            selected
                .model
                .save(&dir.join(format!("fewshot_{shots}shot.safetensors")))?;
        }
        let ssr = SsrClassifier {
            model: &selected.model,
            support_nodes: f.support_nodes,
        };
        let (k1, k2, lambda) = f.k_reciprocal;
        let kr = KReciprocalClassifier {
            params: KReciprocal { k1, k2, lambda },
        };
        let rows: [(&str, &dyn EpisodeClassifierSync, String); 3] = [
            (
                "Baseline",
                &PrototypeClassifier::default(),
                "nearest prototype (cosine)".to_string(),
            ),
            (
                "+ k-reciprocal [75]",
                &kr,
                format!(
                    "k-reciprocal against the prototypes, (k1, k2, λ) = ({k1}, {k2}, {lambda})"
                ),
            ),
            ("+ Ours", &ssr, selected.describe("mean val accuracy")),
        ];
        let episodes_what = format!(
            "{}-way {shots}-shot, {} queries per class, {} test episodes of the novel classes",
            f.ways, f.queries, f.test_episodes
        );
        // Each episode's accuracy is kept: the claims test gaps against the episode noise.
        let test = |c: &dyn EpisodeClassifierSync| -> Result<EpisodeAccuracies> {
            let per_episode = crate::fewshot::episode_accuracies(
                &Wrap(c),
                test_x,
                test_y,
                &ep,
                f.test_episodes,
                f.seed + 2,
            )?;
            Ok((accuracy_interval(&per_episode)?, per_episode))
        };
        let mut baseline = None;
        for (method, classifier, what) in rows {
            let acc = test(classifier)?;
            let prov = Provenance::new(
                &src.data,
                src.scale,
                format!("{}; {episodes_what}; {what}", src.features),
            );
            let key = (
                TABLE_FEWSHOT,
                method,
                src.column.dataset.as_str(),
                src.column.setting.as_str(),
            );
            push_accuracy(out, key, shots, &acc, &prov);
            if method == "Baseline" {
                baseline = Some((acc, prov));
            }
        }
        let Some(ablation) = f.ablation.as_ref().filter(|a| a.shots == shots) else {
            continue;
        };
        // Table 4: the baseline is Table 2's (same test episodes); every SSR row is retrained
        // with the ablation schedule at Table 2's selected λ.
        let start = std::time::Instant::now();
        let column = src.ablation.as_ref().unwrap_or(&src.column);
        if let Some((acc, prov)) = &baseline {
            let key = (
                TABLE_FEWSHOT_ABLATION,
                "Baseline (features)",
                column.dataset.as_str(),
                column.setting.as_str(),
            );
            push_accuracy(out, key, shots, acc, prov);
        }
        for (method, setting, change) in few_shot_ablation_rows() {
            let mut config = f.ssr.clone();
            change(&mut config);
            println!("  Table 4 row {setting}:");
            let lambdas = ablation_lambdas(&config, selected.lambda, &f.lambdas);
            let candidates: Vec<(f64, usize)> = lambdas.iter().map(|&l| (l, 0)).collect();
            let row = select(
                &candidates,
                &config,
                &ablation.train,
                meta_seed,
                &make_task,
                &make_tasks,
                &validate,
            )?;
            let acc = test(&SsrClassifier {
                model: &row.model,
                support_nodes: f.support_nodes,
            })?;
            let prov = Provenance::new(
                &src.data,
                src.scale,
                format!(
                    "{}; {episodes_what}; row `{setting}`: {} ({}, T chosen on validation, the \
                     ablation schedule)",
                    src.features,
                    row.describe("mean val accuracy"),
                    lambda_what(&lambdas, "Table 2's selection")
                ),
            );
            let setting = format!("{};{setting}", column.setting);
            let key = (
                TABLE_FEWSHOT_ABLATION,
                method,
                column.dataset.as_str(),
                setting.as_str(),
            );
            push_accuracy(out, key, shots, &acc, &prov);
        }
        println!(
            "  Table 4 ({shots}-shot ablation): {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The accuracy interval of test episodes and each episode's accuracy (percent).
type EpisodeAccuracies = (AccuracyInterval, Vec<f64>);

/// Pushes the accuracy and 95% half-width of `shots`-shot episodes (ours in percent from
/// [`crate::fewshot::episode_accuracies`], stored as fractions) under `(table, method,
/// dataset, setting)`; the accuracy cell keeps every episode's accuracy as its samples.
fn push_accuracy(
    out: &mut Measurements,
    (table, method, dataset, setting): (&str, &str, &str, &str),
    shots: usize,
    (acc, per_episode): &EpisodeAccuracies,
    prov: &Provenance,
) {
    let cell = |metric: String, v: f64| {
        Measured::new(
            table,
            method,
            dataset,
            metric,
            v / 100.0,
            Unit::Fraction,
            prov.clone(),
        )
        .with_setting(setting)
    };
    // The mean stays the authors' (numpy's pairwise sum); the samples carry the spread, one
    // per test episode — the same episodes for every row, so claims pair them.
    let units = Units::new(format!("{shots}-shot test episodes"), 1, per_episode.len());
    let accuracy = cell(format!("{shots}-shot accuracy"), acc.mean)
        .on_units(per_episode.iter().map(|a| a / 100.0).collect(), units);
    out.cells.push(accuracy);
    out.cells
        .push(cell(format!("{shots}-shot CI95"), acc.half_width));
}

/// An object-safe, thread-safe classifier.
trait EpisodeClassifierSync: EpisodeClassifier + Sync {}
impl<T: EpisodeClassifier + Sync> EpisodeClassifierSync for T {}

struct Wrap<'a>(&'a dyn EpisodeClassifierSync);
impl EpisodeClassifier for Wrap<'_> {
    fn predict(&self, ep: &crate::fewshot::EpisodeFeatures) -> Result<Vec<usize>> {
        self.0.predict(ep)
    }
}

/// A re-ranker's mAP@R and R@1 on the test split, with each counted query's values (the
/// claims test gaps against the query-to-query noise).
#[derive(Debug, Clone)]
struct RetrievalScores {
    map_r: f64,
    r1: f64,
    map_r_queries: Vec<f64>,
    r1_queries: Vec<f64>,
}

/// mAP@R and R@1 of a re-ranker on the test split (queries = references).
fn scores(r: &dyn Reranker, labels: &Labels) -> Result<RetrievalScores> {
    let opts = EvalOptions {
        recall_ks: vec![1],
        hierarchical: false,
        per_level: false,
        chunk_size: 128,
        ..EvalOptions::default()
    };
    let rep = r.evaluate(labels, None, &opts)?;
    let get = |m: &str| -> Result<(f64, Vec<f64>)> {
        let j = rep
            .rows
            .iter()
            .position(|row| row.metric == m && row.level == Some(0))
            .ok_or_else(|| Error::invalid("metric", format!("{m} was not computed")))?;
        let per_query = rep
            .per_query
            .chunks(rep.rows.len())
            .map(|q| q[j])
            .filter(|v| !v.is_nan())
            .collect();
        Ok((rep.rows[j].value, per_query))
    };
    let ((map_r, map_r_queries), (r1, r1_queries)) = (get("mAP@R")?, get("R@1")?);
    Ok(RetrievalScores {
        map_r,
        r1,
        map_r_queries,
        r1_queries,
    })
}

/// Meta-trains SSR for retrieval on `base` for every `(λ, k)` of the recipe and keeps the
/// best by mAP@R on `val`.
fn select_retrieval(r: &RetrievalRecipe, base: &Split, val: &Split) -> Result<Selected> {
    let (val_x, val_y) = val;
    let candidates: Vec<(f64, usize)> = r
        .lambdas
        .iter()
        .flat_map(|&l| r.k.iter().map(move |&k| (l, k)))
        .collect();
    println!(
        "  validation mAP@R of the features: {:.4}",
        scores(&CosineRanking::new(val_x, None)?, val_y)?.map_r
    );
    select_retrieval_with(r, base, val, &candidates, &r.ssr, &r.train)
}

/// Meta-trains SSR for retrieval on `base` with `config` and the schedule `train` for every
/// candidate `(λ, k)` and keeps the best by mAP@R on `val` (`T` chosen after each stage).
fn select_retrieval_with(
    r: &RetrievalRecipe,
    (base_x, base_y): &Split,
    (val_x, val_y): &Split,
    candidates: &[(f64, usize)],
    config: &SsrConfig,
    train: &MetaTrainConfig,
) -> Result<Selected> {
    let make_task = |k: usize| Task::Retrieval { k };
    let make_tasks = |k: usize| -> Result<Box<dyn TaskSource>> {
        let mut t = RetrievalTasks::new(base_x, base_y, k, r.seed)?;
        t.pool = r.pool;
        t.min_positives = r.min_positives;
        t.max_ap = r.max_ap;
        Ok(Box::new(t))
    };
    let validate = |model: &SsrModel| -> Result<f64> {
        let Task::Retrieval { k } = model.task else {
            return Err(Error::invalid("task", "a retrieval model was expected"));
        };
        let top = TopN::from_features(val_x, None, k)?;
        Ok(scores(&SsrRanking::new(model, val_x, None, top)?, val_y)?.map_r)
    };
    select(
        candidates,
        config,
        train,
        r.seed,
        &make_task,
        &make_tasks,
        &validate,
    )
}

/// Table 1's first-stage rankings of `queries` against `references` (`None`: each query
/// against the others): (row, its "+ SSR" row, the ranking, what it is).
type FirstStage = (&'static str, &'static str, Box<dyn Reranker>, String);

fn first_stages(
    r: &RetrievalRecipe,
    queries: &Tensor,
    references: Option<&Tensor>,
) -> Result<Vec<FirstStage>> {
    Ok(vec![
        (
            "Feat. only",
            "Feat + SSR",
            Box::new(CosineRanking::new(queries, references)?),
            "cosine similarity".to_string(),
        ),
        (
            "AQE [9]",
            "AQE + Ours",
            Box::new(QueryExpansion::aqe(r.aqe_k).fit(queries, references)?),
            format!("AQE with {} neighbours", r.aqe_k),
        ),
        (
            "k-reciprocal [75] †",
            "k-reciprocal [75] † + SSR",
            Box::new(
                KReciprocal {
                    k1: r.k1,
                    k2: r.k2,
                    lambda: r.kr_lambda,
                }
                .fit(queries, references)?,
            ),
            format!(
                "k-reciprocal (k1, k2, λ) = ({}, {}, {})",
                r.k1, r.k2, r.kr_lambda
            ),
        ),
    ])
}

fn retrieval(
    r: &RetrievalRecipe,
    feats: &crate::fewshot::SplitFeatures,
    src: &Source,
    out: &mut Measurements,
) -> Result<()> {
    let (test_x, test_y) = &feats.novel;
    let selected = select_retrieval(r, &feats.base, &feats.val)?;
    if let Some(dir) = src.checkpoints {
        selected.model.save(&dir.join("retrieval.safetensors"))?;
    }
    let k = selected.k;
    let ssr_what = selected.describe("mAP@R");
    let mut push = |method: &str, what: String, s: RetrievalScores| {
        let prov = Provenance::new(
            &src.data,
            src.scale,
            format!(
                "{}; the novel classes, every image a query against the others; {what}",
                src.features
            ),
        );
        for (metric, v, per_query) in [
            ("mAP@R", s.map_r, s.map_r_queries),
            ("R@1", s.r1, s.r1_queries),
        ] {
            let cell = Measured::new(
                TABLE_RETRIEVAL,
                method,
                &src.column.dataset,
                metric,
                v,
                Unit::Fraction,
                prov.clone(),
            )
            .with_setting(&src.column.setting);
            let units = Units::new("novel-class test queries", 1, per_query.len());
            out.cells.push(cell.on_units(per_query, units));
        }
    };
    let mut baseline = None;
    for (method, plus, first, what) in first_stages(r, test_x, None)? {
        let feat_scores = scores(first.as_ref(), test_y)?;
        if method == "Feat. only" {
            baseline = Some(feat_scores.clone());
        }
        push(method, what.clone(), feat_scores);
        let top = TopN::from_reranker(first.as_ref(), k)?;
        let ssr = SsrRanking::new(&selected.model, test_x, None, top)?;
        push(
            plus,
            format!("{ssr_what}; applied to the top {k} of: {what}"),
            scores(&ssr, test_y)?,
        );
    }
    let Some(ablation) = &r.ablation else {
        return Ok(());
    };
    // Every row below: retrained with the ablation schedule at Table 1's selected (λ, k), its
    // T chosen on the validation classes, applied to the top k of the features.
    let start = std::time::Instant::now();
    let train_row = |config: &SsrConfig| -> Result<(Selected, RetrievalScores)> {
        let candidates: Vec<(f64, usize)> = ablation_lambdas(config, selected.lambda, &r.lambdas)
            .into_iter()
            .map(|l| (l, k))
            .collect();
        let row = select_retrieval_with(
            r,
            &feats.base,
            &feats.val,
            &candidates,
            config,
            &ablation.train,
        )?;
        let top = TopN::from_features(test_x, None, k)?;
        let s = scores(&SsrRanking::new(&row.model, test_x, None, top)?, test_y)?;
        Ok((row, s))
    };
    let row_what = |name: &str, config: &SsrConfig, row: &Selected| {
        let lambdas = ablation_lambdas(config, selected.lambda, &r.lambdas);
        format!(
            "row `{name}`: {} (k fixed to Table 1's selection, {}, T chosen on validation, the \
             ablation schedule); applied to the top {k} of the features (our N = {})",
            row.describe("mAP@R"),
            lambda_what(&lambdas, "Table 1's selection"),
            k + 1
        )
    };
    // Table 1, Sec. 2.3: SSR reading D^t = 2α(1 − S^t) + (1 − α)J with k-reciprocal's
    // parameters (α = its λ).
    println!("  Table 1 row {KR_INPUT_ROW}:");
    let kr_config = SsrConfig {
        input: SsrInput::KReciprocal {
            alpha: r.kr_lambda,
            k1: r.k1,
            k2: r.k2,
        },
        ..r.ssr.clone()
    };
    let (row, s) = train_row(&kr_config)?;
    push(
        KR_INPUT_ROW,
        format!(
            "{}; J from (k1, k2) = ({}, {}) over each graph's nodes, α = {}",
            row_what(KR_INPUT_ROW, &kr_config, &row),
            r.k1,
            r.k2,
            r.kr_lambda
        ),
        s,
    );
    // Table 3.
    let (dataset3, setting3) = match &src.ablation {
        Some(c) => (c.dataset.clone(), c.setting.clone()),
        None => (
            src.column.dataset.clone(),
            format!("{};N={}", src.column.setting, k + 1),
        ),
    };
    let mut push3 = |method: &str, what: String, s: RetrievalScores| {
        let cell = Measured::new(
            TABLE_RETRIEVAL_ABLATION,
            method,
            &dataset3,
            "mAP@R",
            s.map_r,
            Unit::Fraction,
            Provenance::new(
                &src.data,
                src.scale,
                format!(
                    "{}; the novel classes, every image a query against the others; {what}",
                    src.features
                ),
            ),
        )
        .with_setting(&setting3);
        let units = Units::new("novel-class test queries", 1, s.map_r_queries.len());
        out.cells.push(cell.on_units(s.map_r_queries, units));
    };
    if let Some(b) = baseline {
        push3("Baseline (features)", "cosine similarity".into(), b);
    }
    for (method, _, change) in retrieval_ablation_rows() {
        let mut config = r.ssr.clone();
        change(&mut config);
        println!("  Table 3 row {method}:");
        let (row, s) = train_row(&config)?;
        push3(method, row_what(method, &config, &row), s);
    }
    println!(
        "  Table 3 and the Sec. 2.3 row: {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Table 1's revisited landmark columns: SSR meta-trained on the training landmarks, each
/// first-stage ranking and its "+ SSR" scored with revisitop's Medium and Hard mAP.
fn landmarks(
    r: &RetrievalRecipe,
    set: &LandmarkSet,
    root: &Path,
    scale: Scale,
    checkpoints: Option<&Path>,
    out: &mut Measurements,
) -> Result<()> {
    let (base, val, dim) = set.read_train(root)?;
    let selected = select_retrieval(r, &base, &val)?;
    if let Some(dir) = checkpoints {
        selected.model.save(&dir.join("landmarks.safetensors"))?;
    }
    let k = selected.k;
    let ssr_what = selected.describe("mAP@R");
    let protocols = [
        (Protocol::Medium, "mAP Medium"),
        (Protocol::Hard, "mAP Hard"),
    ];
    for test in &set.tests {
        let t = set.read_test(root, test, dim)?;
        let mut push = |method: &str, what: String, reranker: &dyn Reranker| -> Result<()> {
            let reports = rerank::evaluate_revisited(
                reranker,
                &t.ground_truth,
                &protocols.map(|p| p.0),
                &REVISITOP_KAPPAS,
            )?;
            let prov = Provenance::new(
                t.dataset,
                scale,
                format!(
                    "{}; {} queries against {} database images, revisitop's protocols; {what}",
                    set.describe,
                    t.ground_truth.len(),
                    t.database.dim(0)?
                ),
            );
            for ((_, metric), rep) in protocols.iter().zip(&reports) {
                out.cells.push(
                    Measured::new(
                        TABLE_RETRIEVAL,
                        method,
                        t.dataset,
                        *metric,
                        rep.map,
                        Unit::Fraction,
                        prov.clone(),
                    )
                    .with_setting(&set.setting),
                );
            }
            Ok(())
        };
        for (method, plus, first, what) in first_stages(r, &t.queries, Some(&t.database))? {
            push(method, what.clone(), first.as_ref())?;
            let top = TopN::from_reranker(first.as_ref(), k)?;
            let ssr = SsrRanking::new(&selected.model, &t.queries, Some(&t.database), top)?;
            push(
                plus,
                format!("{ssr_what}; applied to the top {k} of: {what}"),
                &ssr,
            )?;
        }
    }
    Ok(())
}

/// The paper's claims, checked on our measurements. Every row is scored on the same test
/// episodes (few-shot: each episode's accuracy) or queries (retrieval: each query's AP@R), so
/// each comparison is the paired t-test ([`crate::stats::compare`]): with several replicates
/// (backbone and meta-training seeds, `[seeds]`), of each replicate's mean difference over the
/// shared units — the verdict generalises over trained models; with one, over the units.
pub fn claims(m: &Measurements) -> Vec<Claim> {
    let fs_setting = measured_setting(m, TABLE_FEWSHOT, "Baseline", FEWSHOT_SETTING);
    let rt_setting = m
        .cells
        .iter()
        .find(|c| c.table == TABLE_RETRIEVAL && c.metric == "mAP@R")
        .map_or_else(|| RETRIEVAL_SETTING.to_string(), |c| c.setting.clone());
    let fs = |name: &str, method: &str, metric: &str| {
        row(name, m.sample(TABLE_FEWSHOT, method, &fs_setting, metric))
    };
    let rt = |name: &str, method: &str| {
        row(
            name,
            m.sample(TABLE_RETRIEVAL, method, &rt_setting, "mAP@R"),
        )
    };
    let mut c = vec![
        Claim::all_of(
            "SSR improves the baseline in 1-shot and 5-shot (Table 2, every backbone)",
            ["1-shot accuracy", "5-shot accuracy"]
                .iter()
                .map(|k| {
                    let claim = Claim::greater(
                        "",
                        fs("+ Ours", "+ Ours", k),
                        fs("Baseline", "Baseline", k),
                    );
                    (k.to_string(), claim)
                })
                .collect(),
        ),
        Claim::greater(
            "SSR beats k-reciprocal in 1-shot (Table 2, every backbone and dataset)",
            fs("+ Ours", "+ Ours", "1-shot accuracy"),
            fs("+ k-reciprocal", "+ k-reciprocal [75]", "1-shot accuracy"),
        ),
        Claim::greater(
            "SSR improves mAP@R over the features alone (Table 1, CUB/CARS/SOP)",
            rt("Feat + SSR", "Feat + SSR"),
            rt("Feat. only", "Feat. only"),
        ),
        Claim::greater(
            "SSR on top of AQE improves over AQE (Table 1, CUB/CARS)",
            rt("AQE + SSR", "AQE + Ours"),
            rt("AQE", "AQE [9]"),
        ),
        Claim::greater(
            "SSR on top of k-reciprocal improves over k-reciprocal (Table 1, every column)",
            rt("k-reciprocal + SSR", "k-reciprocal [75] † + SSR"),
            rt("k-reciprocal", "k-reciprocal [75] †"),
        ),
    ];
    c.extend(ablation_claims(m));
    c.push(Claim::best_of(
        "k-reciprocal + SSR is the best re-ranking (Table 1, CUB/CARS/SOP)",
        "k-reciprocal + SSR",
        &[
            rt("Feat. only", "Feat. only"),
            rt("Feat + SSR", "Feat + SSR"),
            rt("AQE", "AQE [9]"),
            rt("AQE + SSR", "AQE + Ours"),
            rt("k-reciprocal", "k-reciprocal [75] †"),
            rt("k-reciprocal + SSR", "k-reciprocal [75] † + SSR"),
        ],
    ));
    c
}

/// The setting of `table`'s row `method` in `m` (`default` when the row was not measured): the
/// claims read whichever column the run filled — the paper's column beside the embedded data,
/// or a feature set's own column at the paper scale.
fn measured_setting(m: &Measurements, table: &str, method: &str, default: &str) -> String {
    m.cells
        .iter()
        .find(|c| c.table == table && c.method == method)
        .map_or_else(|| default.to_string(), |c| c.setting.clone())
}

/// Tables 3 and 4's claims (the paper's text on its ablations), on our numbers.
fn ablation_claims(m: &Measurements) -> Vec<Claim> {
    let setting3 = measured_setting(
        m,
        TABLE_RETRIEVAL_ABLATION,
        "Baseline (features)",
        RETRIEVAL_ABLATION_SETTING,
    );
    let setting4 = measured_setting(
        m,
        TABLE_FEWSHOT_ABLATION,
        "Baseline (features)",
        FEWSHOT_ABLATION_SETTING,
    );
    let t3 = |name: &str, method: &str| {
        row(
            name,
            m.sample(TABLE_RETRIEVAL_ABLATION, method, &setting3, "mAP@R"),
        )
    };
    // The ablation's shots come from the recipe: take its accuracy column.
    let metric4 = m
        .cells
        .iter()
        .find(|c| c.table == TABLE_FEWSHOT_ABLATION && c.metric.ends_with("accuracy"))
        .map_or_else(|| "1-shot accuracy".to_string(), |c| c.metric.clone());
    let t4 = |name: &str, method: &str, setting: &str| {
        let setting = if setting.is_empty() {
            setting4.clone()
        } else {
            format!("{setting4};{setting}")
        };
        row(
            name,
            m.sample(TABLE_FEWSHOT_ABLATION, method, &setting, &metric4),
        )
    };
    let ours3 = || t3("Ours", "Ours (sample and query)");
    let ours4 = || t4("Ours", "SSR", "rows=sample+S;columns=S+Q");
    let variants4: Vec<Row> = few_shot_ablation_rows()
        .iter()
        .filter(|(_, setting, _)| setting.starts_with("rows="))
        .map(|(method, setting, _)| t4(setting, method, setting))
        .collect();
    vec![
        Claim::greater(
            "SSR (sample and query rows) improves over the features (Table 3: 34.0 vs 27.8)",
            ours3(),
            t3("Baseline", "Baseline (features)"),
        ),
        Claim::greater_all(
            "Both rows of M_i matter: the full method beats w.o sample and w.o query (Table 3: \
             34.0 vs 32.9 and 28.2)",
            ours3(),
            &[t3("w.o sample", "w.o sample"), t3("w.o query", "w.o query")],
        ),
        Claim::greater(
            "Removing the query row hurts more than removing the sample row (Table 3: 28.2 vs \
             32.9)",
            t3("w.o sample", "w.o sample"),
            t3("w.o query", "w.o query"),
        ),
        Claim::greater(
            "The local sort helps: w.o local sort loses to the full method (Table 3: −1.8)",
            ours3(),
            t3("w.o local sort", "w.o local sort"),
        ),
        Claim::closer(
            "Without subgraphs SSR is close to the baseline: closer to it than to the full \
             method (Table 3: 27.9 vs 27.8)",
            t3("w.o subgraph", "w.o subgraph"),
            t3("Baseline", "Baseline (features)"),
            ours3(),
        ),
        Claim::greater(
            "The feature update helps: w.o feat. update < Ours (Table 3: −3.8)",
            ours3(),
            t3("w.o feat. update", "w.o feat. update"),
        ),
        Claim::best_of(
            "The paper's M_i (rows sample + S, columns S + Q) is the best variant (Table 4: 72.4)",
            "rows=sample+S;columns=S+Q",
            &variants4,
        ),
        Claim::greater(
            "The local sort is crucial in few-shot: w.o local sort < Ours (Table 4)",
            ours4(),
            t4("w.o local sort", "SSR", "ablation=w.o local sort"),
        ),
        Claim::closer(
            "Without subgraphs few-shot SSR falls back near the baseline (Table 4)",
            t4("w.o subgraph", "SSR", "ablation=w.o subgraph"),
            t4("Baseline", "Baseline (features)", ""),
            ours4(),
        ),
        Claim::greater(
            "The feature update helps in few-shot: w.o feat. update < Ours (Table 4)",
            ours4(),
            t4("w.o feat. update", "SSR", "ablation=w.o feat. update"),
        ),
    ]
}

/// The figure: our Table 2 accuracies with their 95% intervals, by shots.
///
/// None when Table 2 was not measured (a paper-scale run without the few-shot feature set).
pub fn figures(m: &Measurements) -> Result<Vec<super::Figure>> {
    let setting = measured_setting(m, TABLE_FEWSHOT, "Baseline", FEWSHOT_SETTING);
    let mut methods = Vec::new();
    for method in ["Baseline", "+ k-reciprocal [75]", "+ Ours"] {
        let mut points = Vec::new();
        for shots in [1usize, 5] {
            let get = |metric: String| m.value(TABLE_FEWSHOT, method, &setting, &metric);
            if let (Some(a), Some(h)) = (
                get(format!("{shots}-shot accuracy")),
                get(format!("{shots}-shot CI95")),
            ) {
                points.push((
                    shots as f64,
                    AccuracyInterval {
                        mean: 100.0 * a,
                        std: f64::NAN,
                        half_width: 100.0 * h,
                        episodes: 0,
                    },
                ));
            }
        }
        if !points.is_empty() {
            let name = if method == "+ Ours" {
                "+ SSR (ours)"
            } else {
                method
            };
            methods.push((name.to_string(), points));
        }
    }
    if methods.is_empty() {
        return Ok(Vec::new());
    }
    let dataset = m
        .cells
        .iter()
        .find(|c| c.table == TABLE_FEWSHOT)
        .map(|c| format!("{}, {}", c.provenance.dataset, c.provenance.scale.as_str()))
        .unwrap_or_default();
    let mut chart = crate::report::accuracy_with_intervals(
        &format!("SSR Table 2 on {dataset}: 5-way accuracy ± 95% CI"),
        "shots (methods side by side)",
        "accuracy (%)",
        methods,
    );
    // Points with error bars, the methods side by side at each shot count (1 and 5 shots are
    // separate experiments: no line between them).
    let count = chart.series.len() as f64;
    for (i, s) in chart.series.iter_mut().enumerate() {
        s.style = crate::report::SeriesStyle::Markers(crate::report::Marker::Circle);
        let offset = 0.25 * (i as f64 - (count - 1.0) / 2.0);
        for p in s.points.iter_mut() {
            p.0 += offset;
        }
    }
    Ok(vec![super::Figure {
        stem: "ssr_fewshot_accuracy".into(),
        chart,
    }])
}

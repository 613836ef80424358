//! SSR at the paper's scale on features read from files (`experiments::ssr_features`): a
//! synthetic stand-in for the users' extracted features, in the exact on-disk formats the
//! `[paper]` recipe reads (`.npy` features, label CSVs, revisitop's ground-truth pickle).

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rankwise::experiments::ssr::{self, measure_recipe_in, SsrRecipe, SsrScaleRecipe};
use rankwise::experiments::ssr_features::{
    Column, FeatureFiles, FeatureSet, LandmarkSet, LandmarkTest, SsrFeatureSets,
};
use rankwise::experiments::Scale;
use rankwise::hierarchy::Labels;
use rankwise::io::{write_labels_csv, write_npy};
use std::fs;
use std::path::{Path, PathBuf};

const DIM: usize = 16;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn unit(v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

fn random_unit(rng: &mut rand::rngs::StdRng) -> Vec<f32> {
    unit((0..DIM).map(|_| rng.random_range(-1.0f32..1.0)).collect())
}

/// `centre + noise · ε`, one row.
fn near(centre: &[f32], noise: f32, rng: &mut rand::rngs::StdRng) -> Vec<f32> {
    unit(
        centre
            .iter()
            .map(|c| c + noise * rng.random_range(-1.0f32..1.0))
            .collect(),
    )
}

fn write_rows(path: &Path, rows: &[Vec<f32>]) {
    let flat: Vec<f32> = rows.concat();
    let t = Tensor::from_vec(flat, (rows.len(), DIM), &Device::Cpu).unwrap();
    write_npy(path, &t).unwrap();
}

/// `classes` clusters of `per_class` rows each, class ids starting at `first`, written as
/// `<name>.npy` + `<name>.csv` under `dir`.
fn write_split(
    dir: &Path,
    name: &str,
    classes: usize,
    per_class: usize,
    first: usize,
    seed: u64,
) -> FeatureFiles {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rows = Vec::new();
    let mut fine = Vec::new();
    for c in 0..classes {
        let centre = random_unit(&mut rng);
        for _ in 0..per_class {
            rows.push(near(&centre, 0.6, &mut rng));
            fine.push((first + c) as i64);
        }
    }
    let features = dir.join(format!("{name}.npy"));
    let labels = dir.join(format!("{name}.csv"));
    write_rows(&features, &rows);
    write_labels_csv(
        &labels,
        &Labels::from_fine(&fine).unwrap(),
        &["class".to_string()],
    )
    .unwrap();
    FeatureFiles {
        features: PathBuf::from(format!("feats/{name}.npy")),
        labels: PathBuf::from(format!("feats/{name}.csv")),
        label_columns: None,
        tensor: None,
    }
}

fn feature_set(dir: &Path, prefix: &str, column: (&str, &str)) -> FeatureSet {
    FeatureSet {
        column: Column {
            dataset: column.0.into(),
            setting: column.1.into(),
        },
        describe: format!("synthetic clusters ({prefix})"),
        base: write_split(dir, &format!("{prefix}_base"), 12, 8, 0, 1),
        validation: write_split(dir, &format!("{prefix}_val"), 6, 8, 100, 2),
        novel: write_split(dir, &format!("{prefix}_novel"), 6, 8, 200, 3),
    }
}

/// revisitop's layout with the loader fixture's ground truth (3 queries), and features in which
/// each query's easy and hard images lie near it and the rest are random.
fn landmark_set(work: &Path) -> LandmarkSet {
    let data_root = work.join("revisitop");
    fs::create_dir_all(data_root.join("roxford5k")).unwrap();
    fs::copy(
        root().join("tests/fixtures/loaders/gnd_p2.pkl"),
        data_root.join("roxford5k/gnd_roxford5k.pkl"),
    )
    .unwrap();
    let gnd = rankwise::data::loaders::revisited::load(
        &data_root,
        rankwise::data::loaders::revisited::Landmarks::Oxford5k,
    )
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut database: Vec<Vec<f32>> = (0..gnd.database.len())
        .map(|_| random_unit(&mut rng))
        .collect();
    let mut queries = Vec::new();
    for g in &gnd.ground_truth {
        let centre = random_unit(&mut rng);
        for &i in g.easy.iter().chain(&g.hard) {
            database[i] = near(&centre, 0.05, &mut rng);
        }
        queries.push(near(&centre, 0.05, &mut rng));
    }
    let feats = work.join("feats");
    write_rows(&feats.join("ox_queries.npy"), &queries);
    write_rows(&feats.join("ox_database.npy"), &database);
    LandmarkSet {
        setting: "feature=[17]".into(),
        describe: "synthetic landmarks".into(),
        base: write_split(&feats, "sfm_base", 12, 8, 0, 4),
        validation: write_split(&feats, "sfm_val", 6, 8, 100, 5),
        data_root: "revisitop".into(),
        tests: vec![LandmarkTest {
            name: "roxford5k".into(),
            queries: "feats/ox_queries.npy".into(),
            database: "feats/ox_database.npy".into(),
        }],
    }
}

/// The tiny recipe with its backbone replaced by feature files written under `work`.
fn recipe(work: &Path) -> SsrScaleRecipe {
    let feats = work.join("feats");
    fs::create_dir_all(&feats).unwrap();
    let mut r = SsrRecipe::for_root(root()).unwrap().tiny;
    r.backbone = None;
    r.features = Some(SsrFeatureSets {
        few_shot: Some(feature_set(
            &feats,
            "mini",
            ("mini-ImageNet", "backbone=WRN-28-10"),
        )),
        retrieval: Some(feature_set(&feats, "cub", ("CUB", "feature=GL"))),
        landmarks: Some(landmark_set(work)),
    });
    r.retrieval.k = vec![6];
    r
}

#[test]
fn every_feature_set_fills_its_paper_column() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let r = recipe(work);
    let ckpt = work.join("ckpt");
    let m = measure_recipe_in(work, &r, Scale::Paper, Some(&ckpt)).unwrap();
    let cells = |table: &str, dataset: &str, setting: &str| {
        m.cells
            .iter()
            .filter(|c| c.table == table && c.dataset == dataset && c.setting == setting)
            .collect::<Vec<_>>()
    };
    // Table 2: (Baseline, k-reciprocal, SSR) × (accuracy, CI) × (1, 5 shots).
    assert_eq!(
        cells("Table 2", "mini-ImageNet", "backbone=WRN-28-10").len(),
        12
    );
    // Table 1: six rows and the Eq. 9 input row × (mAP@R, R@1) for CUB; six rows × (Medium,
    // Hard) for rOxford5K.
    assert_eq!(cells("Table 1", "CUB", "feature=GL").len(), 14);
    let ox = cells("Table 1", "rOxford5K", "feature=[17]");
    assert_eq!(ox.len(), 12);
    // The ablations stand in the feature sets' own columns, never in the paper's CARS column:
    // Table 3 with N = k + 1 = 7, Table 4 (1-shot, accuracy and CI) in mini-ImageNet's.
    let t3 = cells("Table 3", "CUB", "feature=GL;N=7");
    assert_eq!(t3.len(), 1 + ssr::retrieval_ablation_rows().len());
    let t4 = m
        .cells
        .iter()
        .filter(|c| c.table == "Table 4")
        .inspect(|c| {
            assert_eq!(c.dataset, "mini-ImageNet");
            assert!(c.setting.starts_with("backbone=WRN-28-10"), "{c:?}");
        })
        .count();
    assert_eq!(t4, 2 * (1 + ssr::few_shot_ablation_rows().len()));
    assert_eq!(
        m.cells.len(),
        12 + 14 + 12 + t3.len() + t4,
        "{:#?}",
        m.cells
    );
    for c in &m.cells {
        assert!((0.0..=1.0).contains(&c.value), "{c:?}");
        assert_eq!(c.provenance.scale, "paper");
    }
    // The synthetic landmarks put every positive next to its query: the features alone rank
    // them first, so revisitop's mAP is 1 under both protocols.
    for c in ox.iter().filter(|c| c.method == "Feat. only") {
        assert!((c.value - 1.0).abs() < 1e-9, "{c:?}");
    }
    // Well-separated clusters: the features alone are far above chance on CUB's column.
    let feat = cells("Table 1", "CUB", "feature=GL")
        .into_iter()
        .find(|c| c.method == "Feat. only" && c.metric == "mAP@R")
        .unwrap();
    assert!(feat.value > 0.5, "{feat:?}");
    // The claims and the figure read the columns this run filled (mini-ImageNet WRN, CUB GL,
    // CUB's Table 3 with N = 7), not the quick scale's: every claim is decidable.
    for c in ssr::claims(&m) {
        assert_ne!(
            c.verdict,
            rankwise::experiments::Verdict::NotMeasured,
            "{c:?}"
        );
    }
    assert_eq!(ssr::figures(&m).unwrap().len(), 1);
    for f in ["fewshot_1shot", "fewshot_5shot", "retrieval", "landmarks"] {
        let p = ckpt.join(format!("{f}.safetensors"));
        assert!(rankwise::rerank::ssr::SsrModel::load(&p).is_ok(), "{f}");
    }
}

#[test]
fn a_part_left_out_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = recipe(dir.path());
    let sets = r.features.as_mut().unwrap();
    sets.few_shot = None;
    sets.landmarks = None;
    let m = measure_recipe_in(dir.path(), &r, Scale::Paper, None).unwrap();
    assert!(m.cells.iter().all(|c| c.dataset == "CUB"), "{:?}", m.cells);
    // No few-shot set: no Table 2 figure, and not an error.
    assert!(ssr::figures(&m).unwrap().is_empty());
    assert_eq!(m.cells.len(), 14 + 1 + ssr::retrieval_ablation_rows().len());
}

#[test]
fn bad_feature_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let base = recipe(work);
    let run = |r: &SsrScaleRecipe| {
        measure_recipe_in(work, r, Scale::Paper, None)
            .unwrap_err()
            .to_string()
    };

    // A missing file.
    let mut r = base.clone();
    r.features
        .as_mut()
        .unwrap()
        .few_shot
        .as_mut()
        .unwrap()
        .novel
        .features = "feats/nowhere.npy".into();
    let e = run(&r);
    assert!(e.contains("nowhere.npy"), "{e}");

    // Features and labels of different lengths.
    let mut r = base.clone();
    r.features
        .as_mut()
        .unwrap()
        .few_shot
        .as_mut()
        .unwrap()
        .novel
        .labels = "feats/mini_base.csv".into();
    let e = run(&r);
    assert!(
        e.contains("mini_novel.npy") && e.contains("mini_base.csv"),
        "{e}"
    );

    // Query features that do not match the ground truth's query list.
    let mut r = base.clone();
    let sets = r.features.as_mut().unwrap();
    sets.few_shot = None;
    sets.retrieval = None;
    let lm = sets.landmarks.as_mut().unwrap();
    lm.tests[0].queries = "feats/ox_database.npy".into();
    let e = run(&r);
    assert!(
        e.contains("ox_database.npy") && e.contains("qimlist"),
        "{e}"
    );

    // An unknown landmark test set, at parse time.
    let mut r = base.clone();
    r.features
        .as_mut()
        .unwrap()
        .landmarks
        .as_mut()
        .unwrap()
        .tests[0]
        .name = "holidays".into();
    let e = r.validate().unwrap_err().to_string();
    assert!(e.contains("roxford5k") && e.contains("holidays"), "{e}");

    // Both a backbone and features, or neither.
    let mut r = base.clone();
    r.backbone = SsrRecipe::for_root(root()).unwrap().tiny.backbone;
    let e = r.validate().unwrap_err().to_string();
    assert!(e.contains("exactly one"), "{e}");
    r.backbone = None;
    r.features = None;
    assert!(r.validate().is_err());
}

#[test]
fn the_shipped_paper_recipe_names_its_missing_features() {
    let recipe = SsrRecipe::for_root(root()).unwrap();
    let paper = recipe.at(Scale::Paper).unwrap();
    let sets = paper.features.as_ref().unwrap();
    assert!(sets.few_shot.is_some() && sets.retrieval.is_some() && sets.landmarks.is_some());
    // The paper's choices: N = 100, hidden 1,024 / 4,096, 2,000 test episodes.
    assert_eq!(paper.retrieval.k, vec![99]);
    assert_eq!(paper.retrieval.ssr.hidden, 1024);
    assert_eq!(paper.few_shot.ssr.hidden, 4096);
    assert_eq!(paper.few_shot.test_episodes, 2000);
    let dir = tempfile::tempdir().unwrap();
    let e = measure_recipe_in(dir.path(), &paper, Scale::Paper, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("data/ssr_features/mini_wrn"), "{e}");
}

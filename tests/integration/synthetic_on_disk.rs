//! Synthetic datasets in the real datasets' on-disk formats (`data::synthetic_on_disk`): every
//! format loads through its loader with the expected classes, images and splits; every paper
//! recipe's own sampler forms full batches on the dataset sized for it; `rankwise synth-data`
//! then `rankwise train` run paper recipes end to end on the CPU (cheap overrides); and
//! `scripts/recipe_smoke.sh` records one JSON line per recipe.

use rankwise::data::loaders::dyml::{self, GluedRow};
use rankwise::data::loaders::inaturalist::{self, InatConfig};
use rankwise::data::loaders::{cub_cars, inshop, sop, vehicleid, ImageList};
use rankwise::data::synthetic_on_disk::{
    read_marker, remove_synthetic, write_dataset, OnDiskSpec, SyntheticKind, MARKER_FILE,
    MAX_IMAGES,
};
use rankwise::train::{check_recipe, read_results, SamplerConfig, TrainConfig};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// 6 training classes of 3 images, 4 test classes of 3, 3 super-classes, 16-pixel images.
fn small_spec(kind: SyntheticKind) -> OnDiskSpec {
    OnDiskSpec {
        train_classes: 6,
        train_images_per_class: 3,
        test_classes: if kind == SyntheticKind::Cub { 6 } else { 4 },
        test_images_per_class: 3,
        super_classes: 3,
        image_size: 16,
        seed: 3,
    }
}

fn classes(list: &ImageList, level: usize) -> usize {
    list.num_classes(level).unwrap()
}

/// Every file exists, and the first decodes as a JPEG of the spec's height.
fn check_images(list: &ImageList, spec: &OnDiskSpec) {
    list.check_files_exist().unwrap();
    let first = &list.paths()[0];
    let img = image::open(first).unwrap_or_else(|e| panic!("{}: {e}", first.display()));
    assert_eq!(img.height(), spec.image_size, "{}", first.display());
    assert!(first
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jpg")));
}

#[test]
fn every_kind_loads_through_its_loader_with_the_expected_splits() {
    let dir = tempfile::tempdir().unwrap();
    for kind in SyntheticKind::ALL {
        let spec = small_spec(kind);
        let root = dir.path().join(kind.name());
        let written = write_dataset(kind, &root, &spec).unwrap();
        assert_eq!(written.train_images, 18, "{kind}");
        assert_eq!(read_marker(&root).unwrap(), written, "{kind}");
        let levels = kind.num_levels();
        // (training set, test lists) as the loader returns them.
        let (train, tests): (ImageList, Vec<ImageList>) = match kind {
            SyntheticKind::Sop => {
                let d = sop::load(&root).unwrap();
                assert_eq!(d.test.len(), 12);
                assert_eq!((classes(&d.test, 0), classes(&d.test, 1)), (4, 3));
                let first = d.train.paths()[0].strip_prefix(&root).unwrap().to_owned();
                assert!(first.starts_with("bicycle_final"), "{first:?}");
                (d.train, vec![d.test])
            }
            SyntheticKind::Inshop => {
                let d = inshop::load(&root).unwrap();
                assert_eq!((d.test.query.len(), d.test.gallery.len()), (4, 8));
                let q: BTreeSet<i64> = d.test.query.labels().column(0).into_iter().collect();
                let g: BTreeSet<i64> = d.test.gallery.labels().column(0).into_iter().collect();
                assert_eq!(q, g, "every query item has gallery images");
                (d.train, vec![d.test.query, d.test.gallery])
            }
            SyntheticKind::InatBase | SyntheticKind::InatFull => {
                let config = if kind == SyntheticKind::InatBase {
                    InatConfig::base()
                } else {
                    InatConfig::full()
                };
                let d = inaturalist::load(&root, &config).unwrap();
                assert_eq!(d.test.len(), 12);
                assert_eq!(classes(&d.train, 1), 3, "{kind}: genus / super-category");
                if kind == SyntheticKind::InatFull {
                    assert_eq!(classes(&d.train, 6), 1, "kingdom");
                }
                (d.train, vec![d.test])
            }
            SyntheticKind::DymlVehicle | SyntheticKind::DymlAnimal => {
                let scales = dyml::load_test_scales(&root, GluedRow::Keep).unwrap();
                let names: Vec<_> = scales.iter().map(|s| s.scale).collect();
                assert_eq!(names, ["fine", "middle", "coarse"]);
                for (s, expected) in scales.iter().zip([4, 3, 2]) {
                    assert_eq!((s.sets.query.len(), s.sets.gallery.len()), (4, 8));
                    assert_eq!(classes(&s.sets.query, 0), expected, "{}", s.scale);
                }
                // The first row is glued to the header, as in the distributed files.
                let dropped = dyml::load_train(&root, GluedRow::Drop).unwrap();
                assert_eq!(dropped.len(), 17);
                let train = dyml::load_train(&root, GluedRow::Keep).unwrap();
                let tests = scales
                    .into_iter()
                    .flat_map(|s| [s.sets.query, s.sets.gallery])
                    .collect();
                (train, tests)
            }
            SyntheticKind::DymlProduct => {
                let test = dyml::load_product_test(&root, GluedRow::Keep).unwrap();
                assert_eq!(test.len(), 12);
                assert_eq!(test.labels().num_levels(), 3);
                (dyml::load_train(&root, GluedRow::Keep).unwrap(), vec![test])
            }
            SyntheticKind::Cub => {
                let d = cub_cars::load_cub(&root).unwrap();
                assert_eq!(d.test.len(), 18);
                assert_eq!(classes(&d.test, 0), 6);
                (d.train, vec![d.test])
            }
            SyntheticKind::VehicleId => {
                let d = vehicleid::load(&root).unwrap();
                let sizes = d.test.each_ref().map(|t| (t.len(), classes(t, 0)));
                // Nested Small ⊂ Medium ⊂ Large, in the real sets' 1 : 2 : 3 ratio.
                assert_eq!(sizes, [(6, 2), (9, 3), (12, 4)]);
                let [_, _, large] = d.test;
                (d.train, vec![large])
            }
        };
        assert_eq!(train.len(), 18, "{kind}");
        assert_eq!(classes(&train, 0), 6, "{kind}");
        assert_eq!(train.labels().num_levels(), levels, "{kind}");
        check_images(&train, &spec);
        let train_classes: BTreeSet<i64> = train.labels().column(0).into_iter().collect();
        for test in &tests {
            check_images(test, &spec);
            // Test classes are disjoint from the training classes, as in every paper's split
            // (DyML's coarser scales label by super-class, shared with training).
            if test.labels().num_levels() == levels {
                let t: BTreeSet<i64> = test.labels().column(0).into_iter().collect();
                assert!(t.is_disjoint(&train_classes), "{kind}");
            }
        }
        let test_files: usize = tests.iter().map(ImageList::len).sum();
        assert_eq!(written.test_images, test_files, "{kind}");
    }
    // The temporary folders were renamed into place: nothing else is left beside the roots.
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    let mut expected: Vec<String> = SyntheticKind::ALL.map(|k| k.name().to_string()).to_vec();
    expected.sort();
    assert_eq!(names, expected);
}

fn paper_recipes() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/paper");
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 14, "{files:?}");
    files
}

/// The dataset sized for each paper recipe gives its own sampler full batches at the recipe's
/// real batch size, and every test set of its protocol something to rank.
#[test]
fn every_paper_recipe_forms_full_batches_on_its_synthetic_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let mut kinds = BTreeSet::new();
    for path in paper_recipes() {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let recipe = TrainConfig::from_toml_file(&path).unwrap();
        let (kind, mut spec) = OnDiskSpec::for_recipe(&recipe.dataset, &recipe.sampler, 2).unwrap();
        kinds.insert(kind);
        spec.image_size = 8; // only the lists and the sampler are checked here
        let root = dir.path().join(&name);
        write_dataset(kind, &root, &spec).unwrap();
        let check = check_recipe(&recipe.with_dataset_root(&root).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(check.train_images, spec.num_train_images(), "{name}");
        // The m-per-class sampler gives exactly the batches asked for; the pair samplers their
        // fixed number per pair of (two) super-classes; every batch is full.
        let expected = match recipe.sampler {
            SamplerConfig::MPerClass { .. } => 2,
            SamplerConfig::Hierarchical(rankwise::samplers::HierarchicalConfig {
                batches_per_super_pair,
                ..
            }) => batches_per_super_pair,
            SamplerConfig::FastAp(rankwise::samplers::FastApConfig {
                batches_per_meta_pair,
                ..
            }) => batches_per_meta_pair,
        };
        assert_eq!(
            (check.batches, check.full_batches),
            (expected, expected),
            "{name}"
        );
        assert!(!check.test_sets.is_empty(), "{name}");
        for (split, queries, gallery) in &check.test_sets {
            assert!(
                *queries >= 2 || gallery.is_some_and(|g| g >= 1),
                "{name} {split}"
            );
        }
    }
    // The recipes use every kind that has a writer.
    assert_eq!(kinds.len(), SyntheticKind::ALL.len(), "{kinds:?}");
}

#[test]
fn bad_input_is_refused_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec(SyntheticKind::Sop);
    let err = |kind: SyntheticKind, spec: OnDiskSpec| {
        write_dataset(kind, &dir.path().join("x"), &spec)
            .unwrap_err()
            .to_string()
    };
    let e = err(
        SyntheticKind::Sop,
        OnDiskSpec {
            test_images_per_class: 1,
            ..spec.clone()
        },
    );
    assert!(
        e.contains("test_images_per_class") && e.contains("query"),
        "{e}"
    );
    let e = err(
        SyntheticKind::Sop,
        OnDiskSpec {
            super_classes: 13,
            ..spec.clone()
        },
    );
    assert!(e.contains("super_classes") && e.contains("12"), "{e}");
    let e = err(
        SyntheticKind::Cub,
        OnDiskSpec {
            test_classes: 5,
            ..spec.clone()
        },
    );
    assert!(
        e.contains("test_classes") && e.contains("first half"),
        "{e}"
    );
    let e = err(
        SyntheticKind::Sop,
        OnDiskSpec {
            image_size: 4,
            ..spec.clone()
        },
    );
    assert!(e.contains("image_size"), "{e}");
    let e = err(
        SyntheticKind::Sop,
        OnDiskSpec {
            train_classes: MAX_IMAGES,
            ..spec.clone()
        },
    );
    assert!(e.contains(&MAX_IMAGES.to_string()), "{e}");
    assert!(!dir.path().join("x").exists());

    // An existing non-empty folder is refused and left alone; an empty one is filled.
    let real = dir.path().join("real");
    fs::create_dir_all(&real).unwrap();
    fs::write(real.join("Ebay_train.txt"), "mine").unwrap();
    let e = write_dataset(SyntheticKind::Sop, &real, &spec)
        .unwrap_err()
        .to_string();
    assert!(e.contains("real") && e.contains("already exists"), "{e}");
    let e = remove_synthetic(&real).unwrap_err().to_string();
    assert!(
        e.contains("not a synthetic dataset") && e.contains(MARKER_FILE),
        "{e}"
    );
    assert_eq!(
        fs::read_to_string(real.join("Ebay_train.txt")).unwrap(),
        "mine"
    );
    let empty = dir.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    write_dataset(SyntheticKind::Sop, &empty, &spec).unwrap();
    remove_synthetic(&empty).unwrap();
    assert!(!empty.exists());

    // Recipes whose dataset or sampler cannot be served.
    let e = OnDiskSpec::for_recipe(
        &TrainConfig::default().dataset,
        &SamplerConfig::default(),
        2,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("dataset.kind") && e.contains("embedded"), "{e}");
    let fastap = SamplerConfig::FastAp(rankwise::samplers::FastApConfig {
        batch_size: 16,
        batches_per_meta_pair: 2,
        class_level: 0,
        meta_level: 1,
        shuffle_within_class: false,
    });
    let e = OnDiskSpec::for_sampler(SyntheticKind::Cub, &fastap, 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sampler.meta_level") && e.contains("one label level"),
        "{e}"
    );
    let m_per_class = |batch_size, level| SamplerConfig::MPerClass {
        batch_size,
        samples_per_class: 4,
        level,
        batches_per_epoch: None,
        shuffle_within_batch: true,
    };
    let e = OnDiskSpec::for_sampler(SyntheticKind::Sop, &m_per_class(16, 1), 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sampler.level"), "{e}");
    let e = OnDiskSpec::for_sampler(SyntheticKind::Sop, &m_per_class(18, 0), 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sampler.batch_size") && e.contains("18"), "{e}");
    let e = OnDiskSpec::for_sampler(SyntheticKind::Sop, &m_per_class(16, 0), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batches"), "{e}");
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rankwise"))
}

fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("cannot run the rankwise binary")
}

fn succeeds(args: &[&str]) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rankwise {args:?} failed:\n{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "rankwise {args:?}: {stderr}");
    assert!(
        stderr.starts_with("error: ") && !stderr.contains("panicked"),
        "{stderr}"
    );
    stderr
}

/// Overrides that make a paper recipe cheap on a 2-core CPU: a two-stage small CNN on 32 × 32
/// crops (every preset scaled down), batches of 16 (the dataset is sized for them).
const CHEAP: [&str; 12] = [
    "--set",
    "model.backbone.kind=small_cnn",
    "--set",
    "model.backbone.widths=[8,16]",
    "--set",
    "model.backbone.frozen_bn=true",
    "--set",
    "dataset.images.crop_size=32",
    "--set",
    "sampler.batch_size=16",
    "--set",
    "eval.batch_size=64",
];

/// `rankwise synth-data` then `rankwise train` on two paper recipes: FastAP on In-Shop
/// (ImageNet weights removed with `--set pretrained=`, chunked large batches, queries against
/// the gallery) and HAPPIER on DyML-Vehicle (three levels, the per-scale protocol).
#[test]
fn synth_data_then_train_runs_paper_recipes_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for (name, batches) in [("fastap_inshop", 2), ("happier_dyml_vehicle", 2)] {
        let config = format!("{}/configs/paper/{name}.toml", env!("CARGO_MANIFEST_DIR"));
        let root = dir.path().join("data").join(name);
        let root_s = root.to_str().unwrap();
        let mut synth = vec!["synth-data", "--config", &config, "--root", root_s];
        synth.extend(CHEAP);
        synth.extend(["--image-size", "32"]);
        let out = succeeds(&synth);
        assert!(
            out.contains("epoch 0 has 2 batches (2 full)")
                && out.contains(&format!("--set dataset.root={root_s}")),
            "{out}"
        );
        let run_dir = dir.path().join("runs").join(name);
        let set_root = format!("dataset.root={root_s}");
        let mut train = vec![
            "train",
            "--config",
            &config,
            "--set",
            &set_root,
            "--set",
            "epochs=1",
            "--set",
            "pretrained=",
            "--out",
            run_dir.to_str().unwrap(),
            "--device",
            "cpu",
            "-q",
        ];
        train.extend(CHEAP);
        let out = succeeds(&train);
        assert!(out.contains("R@1 (fine, first test split)"), "{out}");
        let results = read_results(&run_dir).unwrap();
        assert_eq!((results.epochs, results.steps), (1, batches), "{name}");
        assert_eq!(results.final_epoch, 1);
        let r1 = results.r_at_1_final.unwrap();
        assert!((0.0..=1.0).contains(&r1), "{r1}");
        let splits: BTreeSet<&str> = results
            .final_metrics
            .iter()
            .map(|r| r.split.as_str())
            .collect();
        if name == "happier_dyml_vehicle" {
            assert!(
                splits.contains("test_coarse") && splits.contains("test"),
                "{splits:?}"
            );
        }
        let toml = fs::read_to_string(run_dir.join("config.toml")).unwrap();
        assert!(!toml.contains("pretrained"), "{toml}");
    }

    // The recipe's weights are not here: without `--set pretrained=` the error says so.
    let config = format!(
        "{}/configs/paper/fastap_inshop.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let root = dir.path().join("data/fastap_inshop");
    let set_root = format!("dataset.root={}", root.display());
    let mut train = vec!["train", "--config", &config, "--set", &set_root];
    train.extend(CHEAP);
    train.extend(["--device", "cpu", "-q"]);
    let e = fails(&train);
    assert!(
        e.contains("resnet50_imagenet1k_v1.safetensors") && e.contains("--set pretrained="),
        "{e}"
    );

    // A second write refuses the existing dataset; --force replaces it (synthetic ones only).
    let synth = |extra: &[&str], root: &Path| {
        let mut a = vec![
            "synth-data",
            "--kind",
            "cub",
            "--root",
            root.to_str().unwrap(),
        ];
        a.extend(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let cub = dir.path().join("data/cub");
    let args = synth(&["--image-size", "16"], &cub);
    succeeds(&strs(&args));
    let e = fails(&strs(&args));
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    let args = synth(
        &[
            "--image-size",
            "16",
            "--force",
            "--train-classes",
            "3",
            "--test-classes",
            "3",
        ],
        &cub,
    );
    let out = succeeds(&strs(&args));
    assert!(out.contains("3 classes × 4"), "{out}");
    assert_eq!(read_marker(&cub).unwrap().spec.train_classes, 3);
    let mine = dir.path().join("mine");
    fs::create_dir_all(&mine).unwrap();
    fs::write(mine.join("keep.txt"), "x").unwrap();
    let e = fails(&strs(&synth(&["--force"], &mine)));
    assert!(e.contains("not a synthetic dataset"), "{e}");
    assert!(mine.join("keep.txt").exists());
    let e = fails(&["synth-data", "--kind", "cars", "--root", "/tmp/never"]);
    assert!(e.contains("cars") && e.contains("sop"), "{e}");
}

/// `scripts/recipe_smoke.sh` on two recipes: one JSON line each (pass, seconds, metrics line),
/// a failing recipe recorded with its error, and the budget skipping the rest.
#[test]
fn recipe_smoke_script_records_one_json_line_per_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/recipe_smoke.sh");
    let smoke = |extra: &str, budget: Option<&str>| -> (bool, Vec<serde_json::Value>) {
        let out_dir = dir.path().join("out");
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(bin())
            .arg(dir.path().join("data"))
            .arg(&out_dir)
            .arg("cpu")
            .env("RECIPE_SMOKE_SCRATCH", dir.path().join("scratch"))
            .env("RECIPE_SMOKE_RECIPES", "rambo_cub smooth_ap_sop")
            .env("RECIPE_SMOKE_IMAGE_SIZE", "32")
            .env(
                "RECIPE_SMOKE_EXTRA_SETS",
                format!("{} {extra}", CHEAP.join(" ")),
            );
        if let Some(b) = budget {
            cmd.env("RECIPE_SMOKE_BUDGET", b);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let text = fs::read_to_string(out_dir.join("recipe_smoke.jsonl"))
            .unwrap_or_else(|e| panic!("{e}: {stderr}"));
        let lines = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        (out.status.success(), lines)
    };

    let (ok, lines) = smoke("", None);
    assert!(ok, "{lines:?}");
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["recipe"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["rambo_cub", "smooth_ap_sop"]);
    for l in &lines {
        assert_eq!(l["status"], "pass", "{l}");
        assert!(l["seconds"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["metrics"].as_str().unwrap().starts_with("R@1"), "{l}");
        assert!((0.0..=1.0).contains(&l["r_at_1"].as_f64().unwrap()), "{l}");
    }
    // Hierarchical batches: 5 per pair of super-classes.
    assert_eq!(lines[1]["steps"], 5);
    // The runs stay in the scratch folder, not among the results.
    let out_files: Vec<_> = fs::read_dir(dir.path().join("out")).unwrap().collect();
    assert_eq!(out_files.len(), 1);
    assert!(dir
        .path()
        .join("scratch/runs/rambo_cub/results.json")
        .exists());

    // A batch size no sampler accepts: both fail, with the error, and the script goes on.
    let (ok, lines) = smoke("--set sampler.batch_size=18", None);
    assert!(!ok);
    assert_eq!(lines.len(), 2);
    for l in &lines {
        assert_eq!(l["status"], "fail", "{l}");
        let e = l["error"].as_str().unwrap();
        assert!(
            e.contains("synth-data exited with 1") && e.contains("batch_size"),
            "{e}"
        );
    }

    // No budget left: every recipe skipped, which is not a failure.
    let (ok, lines) = smoke("", Some("0"));
    assert!(ok);
    assert!(lines.iter().all(|l| l["status"] == "skipped"), "{lines:?}");
}

//! Training and evaluation on real datasets read from disk: tiny fixtures in the exact on-disk
//! formats of SOP, In-Shop and DyML-Vehicle (PNG and JPEG images written to a temporary folder),
//! trained end to end, resumed bit-identically, and the errors of a missing dataset. Also parses
//! and validates every recipe under `configs/`.

use candle_core::{DType, Device};
use image::{Rgb, RgbImage};
use rankwise::data::loaders::dyml::{Dyml, DymlSubset};
use rankwise::data::loaders::inshop::Inshop;
use rankwise::data::loaders::sop;
use rankwise::data::loaders::sop::Sop;
use rankwise::data::pipeline::LoaderConfig;
use rankwise::data::source::{ImageSource, OnDiskSource, View};
use rankwise::models::{
    BackboneConfig, EmbeddingHeadConfig, EmbeddingNetConfig, ParamStore, SmallCnnConfig,
};
use rankwise::train::{
    DatasetConfig, EvalConfig, ImageSettings, InputNorm, OutputConfig, SamplerConfig, TestProtocol,
    TrainConfig, Trainer, TransformPreset,
};
use std::fs;
use std::path::{Path, PathBuf};

fn write(root: &Path, rel: &str, content: impl AsRef<[u8]>) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, content).unwrap();
}

/// An image whose colour depends on its class (so that a network can learn something) with a
/// per-image texture, of a size that varies with `k`; PNG or JPEG by the extension of `rel`.
fn write_image(root: &Path, rel: &str, class: i64, k: usize) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    let (w, h) = (20 + 3 * (k as u32 % 3), 18 + (class as u32 % 4));
    let base = [
        (class * 67 % 256) as u8,
        (class * 151 % 256) as u8,
        (class * 29 % 256) as u8,
    ];
    let img = RgbImage::from_fn(w, h, |x, y| {
        let t = ((x * 7 + y * 13 + k as u32 * 31) % 40) as u8;
        Rgb([
            base[0].wrapping_add(t),
            base[1].wrapping_sub(t / 2),
            base[2] ^ t,
        ])
    });
    img.save(&p).unwrap();
}

/// An SOP-format dataset: train classes 1–4 (super-classes 1, 1, 2, 2) × 4 images, test classes
/// 5–7 × 3 images; every third image a JPEG.
fn sop_fixture(root: &Path) {
    let mut id = 0;
    for (list, classes, per_class) in [
        ("Ebay_train.txt", 1..=4i64, 4usize),
        ("Ebay_test.txt", 5..=7, 3),
    ] {
        let mut text = String::from("image_id class_id super_class_id path\n");
        for class in classes {
            let sup = if class % 2 == 1 { 1 } else { 2 };
            for k in 0..per_class {
                id += 1;
                let ext = if id % 3 == 0 { "JPG" } else { "png" };
                let rel = format!("s{sup}_final/{class}_{k}.{ext}");
                write_image(root, &rel, class, k);
                text.push_str(&format!("{id} {class} {sup} {rel}\n"));
            }
        }
        write(root, list, text);
    }
}

fn settings(threads: usize) -> ImageSettings {
    ImageSettings {
        crop_size: Some(16),
        threads,
        prefetch: 2,
        ..ImageSettings::default()
    }
}

/// A recipe small enough for a test: 16 × 16 crops (the HAPPIER SOP presets scaled down), a
/// two-stage small CNN, batches of 4 classes × 2 images.
fn tiny_config(dataset: DatasetConfig) -> TrainConfig {
    TrainConfig {
        seed: 5,
        dataset,
        input_norm: InputNorm::Imagenet,
        model: EmbeddingNetConfig {
            backbone: BackboneConfig::SmallCnn(SmallCnnConfig {
                widths: vec![4, 8],
                ..SmallCnnConfig::default()
            }),
            head: EmbeddingHeadConfig {
                dim: 8,
                ..EmbeddingHeadConfig::default()
            },
        },
        sampler: SamplerConfig::MPerClass {
            batch_size: 4,
            samples_per_class: 2,
            level: 0,
            batches_per_epoch: None,
            shuffle_within_batch: true,
        },
        epochs: 2,
        eval: EvalConfig {
            every: 1,
            at_start: true,
            recall_ks: vec![1, 2],
            batch_size: 4,
        },
        progress: false,
        ..TrainConfig::default()
    }
}

fn sop_dataset(root: &Path, threads: usize) -> DatasetConfig {
    DatasetConfig::Sop(Sop {
        root: root.to_path_buf(),
        images: settings(threads),
    })
}

fn snapshot(store: &ParamStore) -> Vec<(String, Vec<u32>)> {
    store
        .all()
        .into_iter()
        .map(|(n, v)| {
            let t = v.as_tensor().flatten_all().unwrap().to_dtype(DType::F32);
            let bits = t.unwrap().to_vec1::<f32>().unwrap();
            (n, bits.into_iter().map(f32::to_bits).collect())
        })
        .collect()
}

#[test]
fn sop_on_disk_trains_and_evaluates_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("Stanford_Online_Products");
    sop_fixture(&root);
    let mut config = tiny_config(sop_dataset(&root, 2));
    config.output.dir = Some(dir.path().join("run"));
    let mut trainer = Trainer::from_config(config).unwrap();
    assert_eq!(trainer.train_set().len(), 16);
    assert_eq!(trainer.train_set().image_shape(), (3, 16, 16));
    assert_eq!(trainer.test_set().len(), 9);
    let before = snapshot(trainer.params());
    let report = trainer.fit().unwrap();
    assert_ne!(before, snapshot(trainer.params()));
    assert_eq!(report.epochs.len(), 2);
    // 4 classes × 2 chunks of 2 images, 2 classes per batch.
    assert!(report.epochs.iter().all(|e| e.batches == 4));
    assert!(report.epochs.iter().all(|e| e.mean_loss.is_finite()));
    // Evaluated before training and after each epoch, test set against itself: 9 queries of 8
    // references each, two label levels.
    let r1 = report.log.series("test", "R@1", Some(0));
    assert_eq!(r1.iter().map(|(e, _)| *e).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(r1.iter().all(|(_, v)| (0.0..=1.0).contains(v)));
    let last = report.last_eval.unwrap();
    let test = last.report("test").unwrap();
    assert_eq!((test.num_queries, test.num_references), (9, 8));
    assert!(test.get("H-AP", None).is_some());
    assert!(test.get("R@2", Some(1)).is_some());
    let run = dir.path().join("run");
    assert!(run.join("checkpoint.safetensors").exists());
    let csv = fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(csv
        .lines()
        .any(|l| l.starts_with("2,") && l.contains(",test,R@1,0,")));
}

/// Augmentation is a pure function of (seed, epoch, image index): the same batch twice is the
/// same tensor, whatever the number of threads and whether it is streamed; another epoch
/// draws other crops; the evaluation view is deterministic.
#[test]
fn on_disk_batches_are_reproducible_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    sop_fixture(dir.path());
    let data = sop::load(dir.path()).unwrap();
    let source = |threads: usize| {
        let (train, test) = sop_dataset(dir.path(), threads)
            .transforms(InputNorm::Imagenet)
            .unwrap();
        let loader = LoaderConfig {
            threads,
            prefetch: 1,
            seed: 9,
        };
        OnDiskSource::new("sop train", data.train.clone(), train, test, loader).unwrap()
    };
    let (one, three) = (source(1), source(3));
    let idx = [3usize, 0, 7, 12, 15];
    let values = |s: &OnDiskSource, view: View| -> Vec<f32> {
        let t = s.batch(&idx, view, &Device::Cpu).unwrap();
        assert_eq!(t.dims(), &[5, 3, 16, 16]);
        t.flatten_all().unwrap().to_vec1().unwrap()
    };
    let e0 = View::Train { epoch: 0 };
    let a = values(&one, e0);
    assert_eq!(a, values(&three, e0));
    assert_ne!(a, values(&one, View::Train { epoch: 1 }));
    assert_eq!(values(&one, View::Eval), values(&three, View::Eval));
    let streamed: Vec<_> = three
        .stream(vec![idx.to_vec(), vec![1]], e0, &Device::Cpu)
        .unwrap()
        .collect::<rankwise::Result<_>>()
        .unwrap();
    assert_eq!(streamed.len(), 2);
    assert_eq!(streamed[0].indices, idx);
    let s: Vec<f32> = streamed[0].images.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(s, a);
}

/// Two epochs in one go (1 decoding thread) and one epoch + resume + one epoch (3 threads) end
/// with the same bits: weights, optimizer steps, logged losses and evaluations.
#[test]
fn on_disk_resume_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sop");
    sop_fixture(&root);
    let config = tiny_config(sop_dataset(&root, 1));
    let mut straight = Trainer::from_config(config.clone()).unwrap();
    straight.fit().unwrap();

    let mut first = tiny_config(sop_dataset(&root, 3));
    first.epochs = 1;
    first.output = OutputConfig {
        dir: Some(dir.path().join("run")),
        checkpoint_every: 1,
    };
    let mut t1 = Trainer::from_config(first.clone()).unwrap();
    t1.fit().unwrap();
    let ckpt = t1.checkpoint_path().unwrap();
    drop(t1);
    let mut second = tiny_config(sop_dataset(&root, 3));
    second.resume = Some(ckpt.clone());
    let mut t2 = Trainer::from_config(second).unwrap();
    assert_eq!(t2.epochs_done(), 1);
    t2.fit().unwrap();

    assert_eq!(snapshot(straight.params()), snapshot(t2.params()));
    assert_eq!(straight.global_step(), t2.global_step());
    for (split, metric, level) in [
        ("train", "loss", None),
        ("test", "R@1", Some(0)),
        ("test", "H-AP", None),
    ] {
        assert_eq!(
            straight.log().series(split, metric, level),
            t2.log().series(split, metric, level),
            "{metric}"
        );
    }

    // Another preprocessing is another dataset: the checkpoint is refused, naming the field.
    let mut other = tiny_config(sop_dataset(&root, 1));
    if let DatasetConfig::Sop(Sop { images, .. }) = &mut other.dataset {
        images.train_transform = Some(TransformPreset::RetrievalTrain);
    }
    other.resume = Some(ckpt);
    let e = Trainer::from_config(other).err().unwrap().to_string();
    assert!(e.contains("`dataset`"), "{e}");
}

#[test]
fn missing_data_is_reported_with_the_script_that_prepares_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = |config: TrainConfig| Trainer::from_config(config).err().unwrap().to_string();

    let missing = dir.path().join("nowhere/Stanford_Online_Products");
    let e = err(tiny_config(sop_dataset(&missing, 1)));
    assert!(
        e.contains("nowhere/Stanford_Online_Products")
            && e.contains("not an existing folder")
            && e.contains("data_scripts/sop.sh"),
        "{e}"
    );

    let root = dir.path().join("sop");
    sop_fixture(&root);
    fs::remove_file(root.join("Ebay_test.txt")).unwrap();
    let e = err(tiny_config(sop_dataset(&root, 1)));
    assert!(
        e.contains("Ebay_test.txt") && e.contains("data_scripts/sop.sh"),
        "{e}"
    );

    sop_fixture(&root);
    fs::remove_file(root.join("s1_final/5_2.png")).unwrap();
    let e = err(tiny_config(sop_dataset(&root, 1)));
    assert!(
        e.contains("s1_final/5_2.png") && e.contains("does not exist"),
        "{e}"
    );

    // Without the up-front check, the pipeline names the file when it is first decoded.
    let mut config = tiny_config(sop_dataset(&root, 1));
    if let DatasetConfig::Sop(Sop { images, .. }) = &mut config.dataset {
        images.check_files = false;
    }
    let mut trainer = Trainer::from_config(config.clone()).unwrap();
    let e = trainer.fit().err().unwrap().to_string();
    assert!(e.contains("s1_final/5_2.png"), "{e}");

    // A real dataset with the embedded dataset's statistics.
    config.input_norm = InputNorm::Dataset;
    let e = err(config.clone());
    assert!(e.contains("input_norm") && e.contains("imagenet"), "{e}");
}

/// In-Shop: queries ranked against the gallery, not against each other.
#[test]
fn inshop_evaluates_queries_against_the_gallery() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut lines = Vec::new();
    let mut add = |cat: &str, item: i64, k: usize, status: &str| {
        let rel = format!("img/{cat}/id_{item:08}/{k:02}_1_front.jpg");
        write_image(&root.join("Img"), &rel, item, k);
        lines.push(format!("{rel} id_{item:08} {status}"));
    };
    for item in 1..=4 {
        let cat = if item <= 2 {
            "WOMEN/Dresses"
        } else {
            "MEN/Denim"
        };
        for k in 0..2 {
            add(cat, item, k, "train");
        }
    }
    for item in 10..=12 {
        let cat = if item == 10 {
            "WOMEN/Dresses"
        } else {
            "MEN/Denim"
        };
        add(cat, item, 0, "query");
        add(cat, item, 1, "gallery");
        add(cat, item, 2, "gallery");
    }
    let text = format!(
        "{}\nimage_name item_id evaluation_status\n{}\n",
        lines.len(),
        lines.join("\n")
    );
    write(root, "Eval/list_eval_partition.txt", text);
    let mut config = tiny_config(DatasetConfig::Inshop(Inshop {
        root: root.to_path_buf(),
        images: settings(2),
    }));
    config.epochs = 1;
    config.eval.at_start = false;
    let mut trainer = Trainer::from_config(config).unwrap();
    let report = trainer.fit().unwrap();
    let last = report.last_eval.unwrap();
    let test = last.report("test").unwrap();
    assert_eq!((test.num_queries, test.num_references), (3, 6));
    let r2 = test.get("R@2", Some(0)).unwrap();
    assert!((0.0..=1.0).contains(&r2));
}

/// DyML-Vehicle: one query / gallery pair per scale, averaged (HAPPIER Table 2).
#[test]
fn dyml_vehicle_evaluates_each_scale_and_averages() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The distributed header has no line break before the first row.
    let mut train = String::from("fname, coarse_id, middle_id, fine_id");
    for fine in 0..4i64 {
        for k in 0..2 {
            let name = format!("{}.png", fine * 2 + k as i64);
            write_image(root, &format!("train/imgs/{name}"), fine, k);
            let sep = if fine == 0 && k == 0 { "" } else { "\n" };
            train.push_str(&format!(
                "{sep}{name}, {}, {}, {fine}",
                fine / 2,
                fine / 2 + 10
            ));
        }
    }
    write(root, "train/label.csv", train + "\n");
    for scale in ["fine", "middle", "coarse"] {
        for (part, n) in [("query", 2usize), ("gallery", 4)] {
            let mut csv = String::from("fname, labels\n");
            for k in 0..n {
                let label = (k % 2) as i64;
                write_image(root, &format!("bmk_{scale}/{part}/{k}.jpg"), label + 7, k);
                csv.push_str(&format!("{k}.jpg, {label}\n"));
            }
            write(root, &format!("bmk_{scale}/{part}.csv"), csv);
        }
    }
    let mut config = tiny_config(DatasetConfig::Dyml(Dyml {
        root: root.to_path_buf(),
        subset: DymlSubset::Vehicle,
        glued_row: Default::default(),
        images: settings(2),
    }));
    config.epochs = 1;
    config.eval.at_start = false;
    let mut trainer = Trainer::from_config(config).unwrap();
    assert_eq!(trainer.train_set().labels().num_levels(), 3);
    assert!(matches!(
        trainer.test_protocol(),
        TestProtocol::DymlScales(s) if s.len() == 3
    ));
    let report = trainer.fit().unwrap();
    let dyml = report.last_eval.unwrap().dyml.unwrap();
    assert_eq!(dyml.scales.len(), 3);
    let mean = dyml.scales.iter().map(|s| s.map).sum::<f64>() / 3.0;
    assert!((dyml.map - mean).abs() < 1e-12);
    let logged = report.log.series("test", "mAP", None);
    assert_eq!(logged, vec![(1, dyml.map)]);
    assert_eq!(
        report.log.series("test_middle", "R@1", Some(0)),
        vec![(1, dyml.scales[1].recall_at_1)]
    );
}

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

/// Every recipe parses and validates; every paper-scale recipe trains on a real dataset and
/// documents the table it reproduces, its command, what it needs and its departures.
#[test]
fn every_recipe_under_configs_is_valid() {
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut files = Vec::new();
    toml_files(&configs, &mut files);
    files.sort();
    let paper: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.parent().unwrap().ends_with("paper"))
        .collect();
    assert!(paper.len() >= 10, "{files:?}");
    for path in &files {
        // configs/experiments/shared/ holds the sections recipes `extends` (validated with each
        // recipe that reads them, below); each is read by one at least.
        if path.parent().unwrap().ends_with("experiments/shared") {
            let name = format!(
                "extends = \"shared/{}\"",
                path.file_name().unwrap().to_str().unwrap()
            );
            let recipes = path.parent().unwrap().parent().unwrap();
            assert!(
                files.iter().any(|f| f.parent() == Some(recipes)
                    && fs::read_to_string(f).unwrap().contains(&name)),
                "{}: no recipe of {} has `{name}`",
                path.display(),
                recipes.display()
            );
            continue;
        }
        // configs/experiments/ holds experiment recipes (one training recipe per scale); they
        // are validated as such, every scale's recipe included.
        if path.parent().unwrap().ends_with("experiments") {
            // SSR's recipe holds a backbone and SSR's own fields per scale.
            if path.file_stem().unwrap() == "ssr" {
                rankwise::experiments::ssr::SsrRecipe::from_toml_file(path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                continue;
            }
            let recipe = rankwise::experiments::ExperimentRecipe::from_toml_file(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for config in [
                Some(&recipe.tiny),
                Some(&recipe.quick),
                recipe.paper.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                config
                    .validate()
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            continue;
        }
        let config =
            TrainConfig::from_toml_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The recipe survives a round trip through its TOML form.
        let text = config.to_toml_string().unwrap();
        let back: TrainConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, config, "{}", path.display());
    }
    for path in paper {
        let config = TrainConfig::from_toml_file(path).unwrap();
        assert!(config.dataset.embedded().is_none(), "{}", path.display());
        let text = fs::read_to_string(path).unwrap();
        for key in ["# Reproduces:", "# Command:", "# Needs:", "# Departures"] {
            assert!(text.contains(key), "{} lacks `{key}`", path.display());
        }
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(
            text.contains(&format!("configs/paper/{name}")),
            "{name}: the command must name the file"
        );
    }
}

/// `[validation]` on a dataset read from disk: the held-out and the kept images go through the
/// prefetching loader as images of the full training source (the same pixels and, for the
/// training view, the same augmentation draws, which are keyed by the source's index), and a
/// run trains and selects an epoch.
#[test]
fn on_disk_validation_holds_classes_out_through_the_prefetching_loader() {
    use rankwise::train::validation::{held_out_classes, split_indices};
    use rankwise::train::ValidationConfig;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("Stanford_Online_Products");
    sop_fixture(&root);
    let plain = Trainer::from_config(tiny_config(sop_dataset(&root, 2))).unwrap();
    let validation = ValidationConfig {
        fraction: Some(0.5),
        ..ValidationConfig::default()
    };
    let mut config = tiny_config(sop_dataset(&root, 2));
    config.validation = Some(validation.clone());
    let mut trainer = Trainer::from_config(config).unwrap();
    let full = plain.train_set();
    let classes = held_out_classes(full.labels(), &validation).unwrap();
    let (kept, held) = split_indices(full.labels(), &classes);
    assert_eq!((kept.len(), held.len()), (8, 8));
    let val = trainer.split_source("val").unwrap();
    let train = trainer.train_set();
    assert_eq!(val.labels(), &full.labels().select(&held).unwrap());
    assert_eq!(train.labels(), &full.labels().select(&kept).unwrap());
    let bits = |t: &candle_core::Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.into_iter().map(f32::to_bits).collect()
    };
    let cpu = Device::Cpu;
    for (subset, outer, view) in [
        (&*val, &held, View::Eval),
        (train, &kept, View::Train { epoch: 1 }),
    ] {
        let batches = vec![vec![3, 0], vec![7, 5, 1]];
        let streamed: Vec<_> = subset
            .stream(batches.clone(), view, &cpu)
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        for (batch, local) in streamed.iter().zip(&batches) {
            assert_eq!(&batch.indices, local);
            let direct: Vec<usize> = local.iter().map(|&i| outer[i]).collect();
            let expected = full.batch(&direct, view, &cpu).unwrap();
            assert_eq!(bits(&batch.images), bits(&expected), "{view:?}");
        }
    }
    let report = trainer.fit().unwrap();
    assert_eq!(report.log.series("val", "R@1", Some(0)).len(), 3);
    let s = report.selection.unwrap();
    assert!(s.test("test", "R@1", Some(0)).is_some());
}

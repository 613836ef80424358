//! The embedded procedurally generated dataset: determinism, shapes, hierarchy, splits, and
//! that it is neither trivial nor random noise.

use candle_core::{Device, Tensor, D};
use rankwise::data::{
    few_shot_split, retrieval_split, FewShotFractions, ImageSet, Nuisance, ShapesConfig,
};
use rankwise::hierarchy::{ClassId, Labels};
use std::collections::BTreeSet;

/// 64 fine classes (8 families × 2 variants × 4) × 6 images: quick to render.
fn small() -> ShapesConfig {
    ShapesConfig {
        variants_per_family: 2,
        fine_per_variant: 4,
        images_per_class: 6,
        ..ShapesConfig::default()
    }
}

fn bits(set: &ImageSet) -> Vec<u32> {
    set.pixels().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn generation_is_deterministic_and_seeded() {
    let config = small();
    let a = config.generate().unwrap();
    let b = config.generate().unwrap();
    assert_eq!(bits(&a), bits(&b), "same seed, same bytes");
    // Each image is a pure function of (seed, class, index), whatever else is rendered.
    let one = config.render(37, 4).unwrap();
    assert_eq!(one.as_slice(), a.image(37 * 6 + 4));
    let other = ShapesConfig { seed: 1, ..small() }.generate().unwrap();
    assert_eq!(other.labels(), a.labels());
    let differing = (0..a.len())
        .filter(|&i| a.image(i) != other.image(i))
        .count();
    assert_eq!(differing, a.len(), "another seed changes every image");
}

#[test]
fn shapes_values_and_labels() {
    let config = small();
    let set = config.generate().unwrap();
    assert_eq!(set.len(), 64 * 6);
    assert_eq!(set.image_shape(), (3, 32, 32));
    let t = set.to_tensor(&Device::Cpu).unwrap();
    assert_eq!(t.dims(), &[384, 3, 32, 32]);
    assert!(set.pixels().iter().all(|v| (0.0..=1.0).contains(v)));
    // Not a constant image: the value range is used.
    let (lo, hi) = set
        .pixels()
        .iter()
        .fold((1.0f32, 0.0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    assert!(lo < 0.05 && hi > 0.95, "{lo} {hi}");

    // A valid 3-level hierarchy: Labels::new accepts the rows, finest first.
    let labels = set.labels();
    assert_eq!(labels.num_levels(), 3);
    let rows: Vec<Vec<ClassId>> = (0..labels.len()).map(|i| labels.row(i).to_vec()).collect();
    assert_eq!(&Labels::new(rows).unwrap(), labels);
    let distinct = |l: usize| labels.column(l).into_iter().collect::<BTreeSet<_>>().len();
    assert_eq!((distinct(0), distinct(1), distinct(2)), (64, 16, 8));
    // Classes per parent are as configured.
    assert_eq!(labels.row(0), &[0, 0, 0]);
    assert_eq!(labels.row(63 * 6), &[63, 15, 7]);
    assert_eq!(ShapesConfig::default().num_classes(), 256);
    assert_eq!(ShapesConfig::default().num_images(), 7680);
}

#[test]
fn bad_configurations_are_named() {
    let e = ShapesConfig {
        variants_per_family: 7,
        ..small()
    }
    .generate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("variants_per_family"), "{e}");
    let e = ShapesConfig {
        nuisance: Nuisance {
            scale: (0.8, 0.5),
            ..Nuisance::default()
        },
        ..small()
    }
    .generate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("scale"), "{e}");
    let e = ShapesConfig {
        nuisance: Nuisance {
            noise_std: f32::NAN,
            ..Nuisance::default()
        },
        ..small()
    }
    .render(0, 0)
    .unwrap_err()
    .to_string();
    assert!(e.contains("noise_std"), "{e}");
    assert!(small().render(0, 6).is_err());
}

#[test]
fn retrieval_split_is_class_disjoint_and_keeps_every_family_and_variant() {
    let config = ShapesConfig::default();
    let labels = config.labels().unwrap();
    let split = retrieval_split(&labels, 1).unwrap();
    assert_eq!(split.train_classes.len(), 128);
    assert_eq!(split.test_classes.len(), 128);
    let train: BTreeSet<_> = split.train_classes.iter().collect();
    assert!(split.test_classes.iter().all(|c| !train.contains(c)));
    assert_eq!(split.train.len() + split.test.len(), labels.len());
    let mut all: Vec<usize> = split.train.iter().chain(&split.test).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..labels.len()).collect::<Vec<_>>());
    for level in [1, 2] {
        let on = |items: &[usize]| -> BTreeSet<ClassId> {
            items.iter().map(|&i| labels.row(i)[level]).collect()
        };
        assert_eq!(
            on(&split.train),
            on(&split.test),
            "level {level} on both sides"
        );
    }
    // Train and test both contain round and elongated classes and spread over the hue circle.
    for classes in [&split.train_classes, &split.test_classes] {
        let attrs: Vec<_> = classes
            .iter()
            .map(|&c| config.class(c as usize).unwrap())
            .collect();
        assert!(attrs.iter().any(|a| a.aspect == 1.0) && attrs.iter().any(|a| a.aspect < 1.0));
        let hues: BTreeSet<u32> = attrs.iter().map(|a| (a.hue * 4.0) as u32).collect();
        assert_eq!(hues.len(), 4, "every quarter of the hue circle");
    }
}

#[test]
fn few_shot_split_follows_cifar_fs_proportions() {
    let labels = ShapesConfig::default().labels().unwrap();
    let split = few_shot_split(&labels, FewShotFractions::default(), 0).unwrap();
    // 256 fine classes: round(163.84) / round(40.96) / rest.
    assert_eq!(
        (
            split.base_classes.len(),
            split.val_classes.len(),
            split.novel_classes.len()
        ),
        (164, 41, 51)
    );
    let parts = [
        &split.base_classes,
        &split.val_classes,
        &split.novel_classes,
    ];
    let union: BTreeSet<ClassId> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    assert_eq!(union.len(), 256, "disjoint and complete");
    for (items, classes) in [
        (&split.base, &split.base_classes),
        (&split.val, &split.val_classes),
        (&split.novel, &split.novel_classes),
    ] {
        assert_eq!(items.len(), classes.len() * 30);
        let families: BTreeSet<ClassId> = items.iter().map(|&i| labels.row(i)[2]).collect();
        assert_eq!(families.len(), 8, "every family in every part");
    }
    assert_ne!(
        split,
        few_shot_split(&labels, FewShotFractions::default(), 1).unwrap()
    );
}

/// Mean squared pixel distance between images `i` and `j`.
fn sq_dist(set: &ImageSet, i: usize, j: usize) -> f64 {
    set.image(i)
        .iter()
        .zip(set.image(j))
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum::<f64>()
        / set.image_len() as f64
}

#[test]
fn nuisance_varies_within_classes_and_classes_still_differ() {
    let set = small().generate().unwrap();
    let y = set.labels();
    let (mut within, mut between) = ((0.0, 0usize), (0.0, 0usize));
    for i in 0..set.len() {
        for j in i + 1..set.len() {
            let d = sq_dist(&set, i, j);
            if y.fine(i) == y.fine(j) {
                // Two images of one class are never near-copies.
                assert!(
                    d > 0.005,
                    "images {i} and {j} of one class are too alike: {d}"
                );
                within.0 += d;
                within.1 += 1;
            } else {
                between.0 += d;
                between.1 += 1;
            }
        }
    }
    let (within, between) = (within.0 / within.1 as f64, between.0 / between.1 as f64);
    // Measured with seed 0: within 0.090, between 0.099 (mean squared difference per value).
    assert!(
        within < 0.97 * between,
        "within {within} vs between {between}"
    );
}

/// Brute-force R@1 at each level: the nearest neighbour by cosine similarity (the query itself
/// excluded) shares the query's class at that level.
fn recall_at_1(features: &Tensor, labels: &Labels) -> Vec<f64> {
    let norms = features
        .sqr()
        .unwrap()
        .sum_keepdim(1)
        .unwrap()
        .sqrt()
        .unwrap();
    let x = features.broadcast_div(&norms).unwrap();
    let sim = x.matmul(&x.t().unwrap()).unwrap();
    let n = labels.len();
    // Push the diagonal out of reach.
    let eye = Tensor::eye(n, candle_core::DType::F32, &Device::Cpu).unwrap();
    let sim = (sim - (eye * 1e9).unwrap()).unwrap();
    let nearest: Vec<u32> = sim.argmax(D::Minus1).unwrap().to_vec1().unwrap();
    (0..labels.num_levels())
        .map(|l| {
            let hits = (0..n)
                .filter(|&i| labels.row(i)[l] == labels.row(nearest[i] as usize)[l])
                .count();
            hits as f64 / n as f64
        })
        .collect()
}

#[test]
fn raw_pixel_retrieval_is_hard_but_above_chance() {
    // All 256 classes with 12 images each; R@1 on the 128 test classes (1,536 queries).
    let config = ShapesConfig {
        images_per_class: 12,
        ..ShapesConfig::default()
    };
    let set = config.generate().unwrap();
    let split = retrieval_split(set.labels(), 1).unwrap();
    let test = set.select(&split.test).unwrap();
    let x = test
        .to_tensor(&Device::Cpu)
        .unwrap()
        .flatten_from(1)
        .unwrap();
    let r1 = recall_at_1(&x, test.labels());
    // Chance: 11 positives among 1,535 references (measured with seed 0: 0.081).
    let chance = 11.0 / 1535.0;
    assert!(
        r1[0] > 5.0 * chance,
        "raw-pixel R@1 {r1:?} is near chance {chance}"
    );
    assert!(r1[0] < 0.3, "raw-pixel R@1 {r1:?}: the task is too easy");
    // The hierarchy shows in pixel space: the nearest image shares the family far more often
    // than the fine class (measured: 0.227 vs 0.081).
    assert!(r1[2] > 2.0 * r1[0], "{r1:?}");
}

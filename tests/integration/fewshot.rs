//! The transductive few-shot pipeline on frozen features: classifiers on separable and random
//! features, the interval over episodes, determinism, bad input, and the quick backbone.

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rankwise::fewshot::prototype::{PrototypeClassifier, PrototypeMetric};
use rankwise::fewshot::soft_kmeans::SoftKMeansClassifier;
use rankwise::fewshot::{
    episode_accuracies, evaluate, quick_backbone_features, EpisodeClassifier, QuickBackboneConfig,
};
use rankwise::hierarchy::Labels;
use rankwise::metrics::fewshot::accuracy_interval;
use rankwise::rerank::k_reciprocal::KReciprocal;
use rankwise::rerank::k_reciprocal::KReciprocalClassifier;
use rankwise::samplers::episodes::EpisodeConfig;

/// `classes × per` features: class centre `spread`-scaled one-hot plus unit Gaussian noise.
fn features(classes: usize, per: usize, dim: usize, spread: f32, seed: u64) -> (Tensor, Labels) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for c in 0..classes {
        for _ in 0..per {
            for d in 0..dim {
                let centre = if d == c { spread } else { 0.0 };
                x.push(centre + normal.sample(&mut rng));
            }
            y.push(c as i64);
        }
    }
    (
        Tensor::from_vec(x, (classes * per, dim), &Device::Cpu).unwrap(),
        Labels::from_fine(&y).unwrap(),
    )
}

fn five_way(shots: usize) -> EpisodeConfig {
    EpisodeConfig {
        shots,
        ..EpisodeConfig::default()
    }
}

#[test]
fn separable_clusters_are_classified_perfectly() {
    let (x, y) = features(10, 20, 12, 40.0, 1);
    let classifiers: Vec<(&str, Box<dyn EpisodeClassifier + Sync>)> = vec![
        ("cosine", Box::new(PrototypeClassifier::default())),
        (
            "euclidean",
            Box::new(PrototypeClassifier {
                metric: PrototypeMetric::SquaredEuclidean,
            }),
        ),
        ("soft k-means", Box::new(SoftKMeansClassifier::default())),
        ("k-reciprocal", Box::new(KReciprocalClassifier::default())),
    ];
    for (name, c) in &classifiers {
        let acc = evaluate(c.as_ref(), &x, &y, &five_way(1), 40, 7).unwrap();
        assert_eq!((acc.mean, acc.half_width), (100.0, 0.0), "{name}");
        assert_eq!(acc.episodes, 40);
    }
}

#[test]
fn random_features_give_chance_and_the_interval_is_over_episodes() {
    let (x, y) = features(10, 20, 12, 0.0, 2);
    let c = PrototypeClassifier::default();
    let per_episode = episode_accuracies(&c, &x, &y, &five_way(1), 400, 11).unwrap();
    let acc = evaluate(&c, &x, &y, &five_way(1), 400, 11).unwrap();
    assert_eq!(acc, accuracy_interval(&per_episode).unwrap());
    // 5-way chance is 20%; 400 episodes of 75 queries put the mean within ~1 point of it.
    assert!((acc.mean - 20.0).abs() < 3.0, "{acc:?}");
    assert!(acc.half_width > 0.0 && acc.half_width < 2.0, "{acc:?}");
}

#[test]
fn episodes_are_deterministic_given_the_seed() {
    let (x, y) = features(8, 20, 10, 1.5, 3);
    let c = PrototypeClassifier::default();
    let a = episode_accuracies(&c, &x, &y, &five_way(5), 30, 5).unwrap();
    let b = episode_accuracies(&c, &x, &y, &five_way(5), 30, 5).unwrap();
    assert_eq!(a, b);
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| episode_accuracies(&c, &x, &y, &five_way(5), 30, 5).unwrap());
    assert_eq!(a, one_thread);
    let other = episode_accuracies(&c, &x, &y, &five_way(5), 30, 6).unwrap();
    assert_ne!(a, other);
}

#[test]
fn bad_input_is_an_error() {
    let (x, y) = features(4, 20, 6, 3.0, 4);
    let c = PrototypeClassifier::default();
    // 5-way episodes from 4 classes.
    let e = evaluate(&c, &x, &y, &five_way(1), 10, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ways"), "{e}");
    let three = EpisodeConfig {
        ways: 3,
        ..EpisodeConfig::default()
    };
    // Features and labels of different lengths.
    let fewer = x.narrow(0, 0, 70).unwrap();
    assert!(evaluate(&c, &fewer, &y, &three, 10, 0).is_err());
    assert!(evaluate(&c, &x, &y, &three, 0, 0).is_err());
    // k1 larger than an episode's nodes (3 prototypes + 45 queries).
    let kr = KReciprocalClassifier {
        params: KReciprocal {
            k1: 60,
            ..KReciprocal::default()
        },
    };
    assert!(evaluate(&kr, &x, &y, &three, 2, 0).is_err());
}

#[test]
fn quick_backbone_features_tiny() {
    use rankwise::data::FewShotFractions;
    use rankwise::models::{BackboneConfig, EmbeddingHeadConfig, SmallCnnConfig};
    use rankwise::train::SamplerConfig;
    let mut config = QuickBackboneConfig {
        fractions: FewShotFractions {
            base: 0.5,
            val: 0.25,
            novel: 0.25,
        },
        ..QuickBackboneConfig::default()
    };
    let t = &mut config.train;
    t.epochs = 1;
    let data = t.dataset.embedded_mut().unwrap();
    data.families = 2;
    data.variants_per_family = 1;
    data.fine_per_variant = 8;
    data.images_per_class = 12;
    data.image_size = 16;
    t.eval.at_start = false;
    t.model.backbone = BackboneConfig::SmallCnn(SmallCnnConfig {
        widths: vec![8, 16],
        ..SmallCnnConfig::default()
    });
    t.model.head = EmbeddingHeadConfig {
        dim: 32,
        ..EmbeddingHeadConfig::default()
    };
    t.sampler = SamplerConfig::MPerClass {
        batch_size: 32,
        samples_per_class: 4,
        level: 0,
        batches_per_epoch: None,
        shuffle_within_batch: true,
    };
    let loss = rankwise::losses::smooth_ap::SmoothAp::default();
    let trained = quick_backbone_features(&config, &loss).unwrap();
    assert_eq!(trained.features.dims(), &[4 * 12, 32]);
    assert_eq!(trained.labels.len(), 48);
    assert_eq!(
        (trained.base_classes.len(), trained.novel_classes.len()),
        (8, 4)
    );
    assert!(trained
        .novel_classes
        .iter()
        .all(|c| !trained.base_classes.contains(c)));
    assert_eq!(trained.report.as_ref().unwrap().epochs.len(), 1);
    let episodes = EpisodeConfig {
        ways: 2,
        shots: 1,
        queries: 5,
        ..EpisodeConfig::default()
    };
    let acc = evaluate(
        &PrototypeClassifier::default(),
        &trained.features,
        &trained.labels,
        &episodes,
        20,
        0,
    )
    .unwrap();
    assert!(acc.mean.is_finite() && acc.mean >= 0.0 && acc.mean <= 100.0);
    config.train_backbone = false;
    let random = quick_backbone_features(&config, &loss).unwrap();
    assert!(random.report.is_none());
    assert_eq!(random.labels, trained.labels);
    let diff = (&random.features - &trained.features)
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff > 0.0, "training changed nothing");
}

//! SSR (rankwise::rerank::ssr): meta-training lowers the loss, the re-ranker and the few-shot
//! classifier plug into the crate's evaluation, checkpoints round-trip, bad input is an error.

use candle_core::{DType, Device, Tensor};
use rankwise::fewshot::{evaluate, EpisodeClassifier, EpisodeFeatures};
use rankwise::hierarchy::Labels;
use rankwise::rerank::ssr::{
    meta_train, FewShotTasks, GroupSchedule, Layout, MetaTrainConfig, RetrievalTasks,
    SsrClassifier, SsrConfig, SsrModel, SsrRanking, Stage, SupportNodes, Task, UpdateRule,
};
use rankwise::rerank::{rankings, CosineRanking, Reranker, TopN};
use rankwise::retrieval::EvalOptions;
use rankwise::samplers::episodes::EpisodeConfig;

/// `classes × per_class` points: a class centre plus noise of scale `noise`, in `d` dims.
fn clusters(classes: usize, per_class: usize, d: usize, noise: f32, seed: u64) -> (Tensor, Labels) {
    let mut x = seed.wrapping_add(0x9E3779B97F4A7C15);
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let centres: Vec<Vec<f32>> = (0..classes)
        .map(|_| (0..d).map(|_| rnd()).collect())
        .collect();
    let mut v = Vec::new();
    let mut y = Vec::new();
    for (c, centre) in centres.iter().enumerate() {
        for _ in 0..per_class {
            v.extend(centre.iter().map(|m| m + noise * rnd()));
            y.push(c as i64);
        }
    }
    let n = classes * per_class;
    (
        Tensor::from_vec(v, (n, d), &Device::Cpu).unwrap(),
        Labels::from_fine(&y).unwrap(),
    )
}

fn small(config: SsrConfig) -> SsrConfig {
    SsrConfig {
        hidden: 32,
        ..config
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn meta_training_decreases_the_retrieval_and_few_shot_losses() {
    let (x, y) = clusters(12, 8, 16, 1.2, 1);
    // Retrieval: hard lists of 10 references.
    let mut tasks = RetrievalTasks::new(&x, &y, 10, 0).unwrap();
    tasks.max_ap = 0.9;
    let cfg = small(SsrConfig {
        steps: 1,
        lambda: 0.05,
        ..SsrConfig::default()
    });
    let mut model = SsrModel::new(cfg, Task::Retrieval { k: 10 }, DType::F32, 0).unwrap();
    let train = MetaTrainConfig {
        stages: vec![Stage {
            steps: 1,
            iterations: 150,
            lr: 0.02,
            lr_drop_at: None,
            lr_factor: 0.1,
        }],
        momentum: 0.9,
        nesterov: false,
        weight_decay: 0.0,
    };
    let losses = meta_train(&mut model, &tasks, &train).unwrap();
    let (head, tail) = (mean(&losses[..30]), mean(&losses[losses.len() - 30..]));
    assert!(tail < 0.9 * head, "retrieval loss {head} → {tail}");

    // Few-shot: 3-way 1-shot, 4 queries per class, the authors' layout and schedule.
    let ep = EpisodeConfig {
        ways: 3,
        shots: 1,
        queries: 4,
        level: 0,
        shuffle_queries: true,
    };
    let tasks = FewShotTasks::new(&x, &y, &ep, SupportNodes::Prototypes, 0).unwrap();
    let cfg = small(SsrConfig {
        steps: 1,
        lambda: 0.05,
        layout: Layout::AuthorsCode,
        rule: UpdateRule::AuthorsCode,
        schedule: GroupSchedule::Alternating,
        ..SsrConfig::default()
    });
    let mut model = SsrModel::new(
        cfg,
        Task::FewShot {
            supports: 3,
            queries: 12,
        },
        DType::F32,
        0,
    )
    .unwrap();
    let losses = meta_train(&mut model, &tasks, &train).unwrap();
    let (head, tail) = (mean(&losses[..30]), mean(&losses[losses.len() - 30..]));
    assert!(tail < 0.9 * head, "few-shot loss {head} → {tail}");
}

#[test]
fn zero_update_signal_keeps_the_ranking_and_the_reranker_scores_with_the_crate() {
    let (x, y) = clusters(6, 5, 8, 1.0, 2);
    let k = 7;
    let model = SsrModel::new(
        small(SsrConfig::default()),
        Task::Retrieval { k },
        DType::F32,
        0,
    )
    .unwrap();
    model.zero_update_signal().unwrap();
    let top = TopN::from_features(&x, None, k).unwrap();
    let ssr = SsrRanking::new(&model, &x, None, top).unwrap();
    let cos = CosineRanking::new(&x, None).unwrap();
    assert_eq!(rankings(&ssr).unwrap(), rankings(&cos).unwrap());
    let opts = EvalOptions::default();
    let a = ssr.evaluate(&y, None, &opts).unwrap();
    let b = cos.evaluate(&y, None, &opts).unwrap();
    assert_eq!(a.get("mAP@R", Some(0)), b.get("mAP@R", Some(0)));

    // A trained-from-scratch model changes only the order inside each top-k.
    let model = SsrModel::new(
        small(SsrConfig {
            lambda: 0.5,
            ..SsrConfig::default()
        }),
        Task::Retrieval { k },
        DType::F32,
        1,
    )
    .unwrap();
    let top = TopN::from_features(&x, None, k).unwrap();
    let ssr = SsrRanking::new(&model, &x, None, top.clone()).unwrap();
    let (rs, rc) = (rankings(&ssr).unwrap(), rankings(&cos).unwrap());
    for q in 0..rs.len() {
        let mut a = rs[q][..k].to_vec();
        let mut b = top.row_indices(q).to_vec();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "query {q}: the top-k set changed");
        assert_eq!(rs[q][k..], rc[q][k..], "query {q}: ranks beyond k changed");
    }
}

#[test]
fn few_shot_with_a_perfect_feature_extractor_is_always_right() {
    // One orthogonal direction per class, no noise.
    let (classes, per, d) = (8, 10, 8);
    let mut v = vec![0f32; classes * per * d];
    let mut y = Vec::new();
    for c in 0..classes {
        for i in 0..per {
            v[(c * per + i) * d + c] = 1.0 + 0.1 * i as f32;
            y.push(c as i64);
        }
    }
    let x = Tensor::from_vec(v, (classes * per, d), &Device::Cpu).unwrap();
    let y = Labels::from_fine(&y).unwrap();
    let ep = EpisodeConfig {
        ways: 5,
        shots: 1,
        queries: 5,
        level: 0,
        shuffle_queries: true,
    };
    for nodes in [SupportNodes::Shots, SupportNodes::Prototypes] {
        let model = SsrModel::new(
            small(SsrConfig::default()),
            Task::FewShot {
                supports: 5,
                queries: 25,
            },
            DType::F32,
            0,
        )
        .unwrap();
        let c = SsrClassifier {
            model: &model,
            support_nodes: nodes,
        };
        let acc = evaluate(&c, &x, &y, &ep, 10, 0).unwrap();
        assert_eq!(acc.mean, 100.0, "{nodes:?}");
    }
}

#[test]
fn checkpoints_round_trip_and_bad_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ssr.safetensors");
    let model = SsrModel::new(
        small(SsrConfig {
            lambda: 0.3,
            ..SsrConfig::default()
        }),
        Task::Retrieval { k: 4 },
        DType::F32,
        5,
    )
    .unwrap();
    model.save(&path).unwrap();
    let back = SsrModel::load(&path).unwrap();
    assert_eq!(back.config, model.config);
    assert_eq!(back.task, model.task);
    let (x, _) = clusters(2, 3, 6, 0.5, 3);
    let nodes = x.narrow(0, 0, 5).unwrap();
    assert_eq!(
        back.refine_retrieval(&nodes).unwrap(),
        model.refine_retrieval(&nodes).unwrap()
    );
    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, b"not a checkpoint").unwrap();
    let e = SsrModel::load(&bad).unwrap_err().to_string();
    assert!(e.contains("bad.safetensors"), "{e}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let (x, y) = clusters(3, 4, 6, 0.5, 4);
    let model = SsrModel::new(
        small(SsrConfig::default()),
        Task::Retrieval { k: 5 },
        DType::F32,
        0,
    )
    .unwrap();
    // k larger than the gallery.
    assert!(TopN::from_features(&x, None, 12).is_err());
    let e = RetrievalTasks::new(&x, &y, 12, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains('k'), "{e}");
    // A list of another length than the model's k.
    let top = TopN::from_features(&x, None, 4).unwrap();
    let e = SsrRanking::new(&model, &x, None, top)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("top"), "{e}");
    // NaN features.
    let mut v = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v[7] = f32::NAN;
    let xn = Tensor::from_vec(v, (12, 6), &Device::Cpu).unwrap();
    let e = model
        .refine(&xn.narrow(0, 0, 6).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("NaN"), "{e}");
    assert!(RetrievalTasks::new(&xn, &y, 5, 0).is_err());
    // Dimension mismatch: wrong node count, references of another width.
    let e = model
        .refine(&x.narrow(0, 0, 4).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 node features"), "{e}");
    let other = Tensor::zeros((12, 5), DType::F32, &Device::Cpu).unwrap();
    let top = TopN::from_features(&x, None, 5).unwrap();
    assert!(SsrRanking::new(&model, &x, Some(&other), top).is_err());
    // Bad hyperparameters.
    let bad = SsrConfig {
        lambda: f64::NAN,
        ..SsrConfig::default()
    };
    let e = SsrModel::new(bad, Task::Retrieval { k: 5 }, DType::F32, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lambda"), "{e}");
    assert!(SsrModel::new(
        SsrConfig::default(),
        Task::Retrieval { k: 0 },
        DType::F32,
        0
    )
    .is_err());
    // An episode whose size does not match the model.
    let few = SsrModel::new(
        small(SsrConfig::default()),
        Task::FewShot {
            supports: 2,
            queries: 4,
        },
        DType::F32,
        0,
    )
    .unwrap();
    let ep = EpisodeFeatures::new(
        x.narrow(0, 0, 2).unwrap(),
        vec![0, 1],
        x.narrow(0, 2, 3).unwrap(),
        vec![0, 1, 1],
        2,
    )
    .unwrap();
    let c = SsrClassifier {
        model: &few,
        support_nodes: SupportNodes::Shots,
    };
    assert!(c.predict(&ep).is_err());
}

/// The PyTorch reference of the authors' update (`tests/fixtures/ssr/make_authors_update.py`):
/// raw features of norms 3–6, random MLPs, T = 3, λ = 0.05, float64.
fn authors_fixture() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ssr/authors_update.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn numbers(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(numbers).collect(),
        x => vec![x.as_f64().expect("a number")],
    }
}

fn rows(v: &serde_json::Value) -> Tensor {
    let r = v.as_array().unwrap().len();
    let flat = numbers(v);
    Tensor::from_vec(flat.clone(), (r, flat.len() / r), &Device::Cpu).unwrap()
}

/// The fixture's model under `rule` (the authors' layout and alternating schedule).
fn authors_model(case: &serde_json::Value, rule: UpdateRule) -> SsrModel {
    let t = &case["task"];
    let task = match t["kind"].as_str().unwrap() {
        "retrieval" => Task::Retrieval {
            k: t["k"].as_u64().unwrap() as usize,
        },
        _ => Task::FewShot {
            supports: t["supports"].as_u64().unwrap() as usize,
            queries: t["queries"].as_u64().unwrap() as usize,
        },
    };
    let config = SsrConfig {
        hidden: case["hidden"].as_u64().unwrap() as usize,
        steps: case["steps"].as_u64().unwrap() as usize,
        lambda: case["lambda"].as_f64().unwrap(),
        layout: Layout::AuthorsCode,
        rule,
        schedule: GroupSchedule::Alternating,
        ..SsrConfig::default()
    };
    let model = SsrModel::new(config, task, DType::F64, 0).unwrap();
    let params = case["params"].as_object().unwrap();
    let mut set = 0;
    for (name, var) in model.vars() {
        let Some(p) = params.get(&name) else {
            assert_eq!(name, "tau", "the fixture has no `{name}`");
            continue;
        };
        var.set(&Tensor::from_vec(numbers(p), var.dims(), &Device::Cpu).unwrap())
            .unwrap();
        set += 1;
    }
    assert_eq!(
        set,
        params.len(),
        "every fixture parameter is a model parameter"
    );
    model
}

fn assert_rows_close(got: &Tensor, expect: &Tensor, tol: f64, what: &str) {
    let (g, e) = (
        got.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        expect.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
    );
    assert_eq!(g.len(), e.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(&e).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: {a} vs PyTorch {b}"
        );
    }
}

fn max_gap(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_vec0::<f64>()
        .unwrap()
}

#[test]
fn authors_update_on_raw_features_matches_pytorch() {
    let fx = authors_fixture();
    // Retrieval: the query then the database, three steps.
    let case = &fx["retrieval"];
    let feats = rows(&case["features"]);
    for (rule, key) in [
        (UpdateRule::AuthorsCode, "exact"),
        (UpdateRule::AuthorsCodeFirstOrder, "first_order"),
    ] {
        let model = authors_model(case, rule);
        let refined = model.refine(&feats).unwrap();
        assert_rows_close(&refined, &rows(&case[key]), 1e-12, key);
    }
    // The path through the other group's update moves the features here by ~7e-4.
    let gap = max_gap(&rows(&case["exact"]), &rows(&case["first_order"]));
    assert!(gap > 1e-4, "{gap}");

    // Few-shot: class prototypes (means of the raw shots) then the queries.
    let case = &fx["few_shot"];
    let ways = case["ways"].as_u64().unwrap() as usize;
    let labels =
        |k: &str| -> Vec<usize> { numbers(&case[k]).iter().map(|&v| v as usize).collect() };
    let ep = EpisodeFeatures::new(
        rows(&case["support"]),
        labels("support_labels"),
        rows(&case["query"]),
        labels("query_labels"),
        ways,
    )
    .unwrap();
    let (nodes, node_labels) =
        rankwise::rerank::ssr::episode_nodes(&ep, SupportNodes::Prototypes, DType::F64).unwrap();
    for (rule, key) in [
        (UpdateRule::AuthorsCode, "exact"),
        (UpdateRule::AuthorsCodeFirstOrder, "first_order"),
    ] {
        let model = authors_model(case, rule);
        assert_rows_close(
            &model.refine(&nodes).unwrap(),
            &rows(&case[key]),
            1e-12,
            key,
        );
        let scores = model.few_shot_scores(&nodes, &node_labels, ways).unwrap();
        let flat: Vec<f64> = scores.iter().flatten().copied().collect();
        let expect = rows(&case[format!("{key}_scores")]);
        let got = Tensor::from_vec(flat, expect.dims(), &Device::Cpu).unwrap();
        assert_rows_close(&got, &expect, 1e-12, "scores");
        let predicted = SsrClassifier {
            model: &model,
            support_nodes: SupportNodes::Prototypes,
        }
        .predict(&ep)
        .unwrap();
        let argmax: Vec<usize> = expect
            .to_vec2::<f64>()
            .unwrap()
            .iter()
            .map(|r| (0..r.len()).fold(0, |b, j| if r[j] > r[b] { j } else { b }))
            .collect();
        assert_eq!(predicted, argmax, "{key}");
    }
    let gap = max_gap(&rows(&case["exact"]), &rows(&case["first_order"]));
    assert!(gap > 1e-3, "{gap}");

    // Meta-training: the cross-entropy of τ·cos after the exact refinement and its gradient
    // w.r.t. every parameter (through the second-order path: third derivatives of the map).
    let model = authors_model(case, UpdateRule::AuthorsCode);
    let loss = model
        .few_shot_loss(&nodes, &node_labels, &ep.query_labels)
        .unwrap();
    let v = loss.to_vec0::<f64>().unwrap();
    let expect = case["exact_loss"].as_f64().unwrap();
    assert!(
        (v - expect).abs() < 1e-12 * expect,
        "{v} vs PyTorch {expect}"
    );
    let grads = loss.backward().unwrap();
    let expected = case["exact_loss_grads"].as_object().unwrap();
    for (name, var) in model.vars() {
        let g = grads.get(var.as_tensor()).expect("a gradient");
        let e = Tensor::from_vec(numbers(&expected[&name]), var.dims(), &Device::Cpu).unwrap();
        assert_rows_close(g, &e, 1e-10, &name);
    }
}

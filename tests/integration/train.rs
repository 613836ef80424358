//! Optimizers against hand-computed steps, the exact large-batch gradient, and the trainer:
//! warm-up, outputs, and bit-identical resume.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rankwise::data::EmbeddedConfig;
use rankwise::hierarchy::Labels;
use rankwise::losses::{check_batch, RankLoss};
use rankwise::losses::{csl::CslConfig, happier::HappierConfig, rambo::RamboConfig, LossConfig};
use rankwise::models::{
    BackboneConfig, EmbeddingHeadConfig, EmbeddingNet, EmbeddingNetConfig, ParamStore,
    SmallCnnConfig,
};
use rankwise::train::large_batch::{chunked_gradients, direct_gradients};
use rankwise::train::{
    AdamConfig, Algorithm, DatasetConfig, Decay, EvalConfig, GroupConfig, LrSchedule, Optimizer,
    OptimizerConfig, OutputConfig, ParamGroup, PretrainStage, SamplerConfig, SgdConfig,
    TrainConfig, Trainer,
};

/// A contrastive loss on cosine similarities (Hadsell et al., 2006), written here because the
/// crate's losses live elsewhere: the mean over ordered pairs `i ≠ j` of `1 − s_ij` for
/// positives (same fine class) and `max(0, s_ij − margin)` for negatives.
struct Contrastive {
    margin: f64,
}

impl RankLoss for Contrastive {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> rankwise::Result<Tensor> {
        check_batch(embeddings, labels)?;
        let b = labels.len();
        let norm = embeddings.sqr()?.sum_keepdim(1)?.sqrt()?.maximum(1e-12)?;
        let e = embeddings.broadcast_div(&norm)?;
        let s = e.matmul(&e.t()?)?;
        let mask = |same: bool| -> rankwise::Result<Tensor> {
            let v: Vec<f64> = (0..b * b)
                .map(|k| {
                    let (i, j) = (k / b, k % b);
                    f64::from(u8::from(
                        i != j && (labels.fine(i) == labels.fine(j)) == same,
                    ))
                })
                .collect();
            Ok(Tensor::from_vec(v, (b, b), e.device())?.to_dtype(e.dtype())?)
        };
        let pos = (mask(true)? * (1.0 - &s)?)?;
        let neg = (mask(false)? * (&s - self.margin)?.relu()?)?;
        Ok(((pos + neg)?.sum_all()? / (b * (b - 1)) as f64)?)
    }
}

fn cpu() -> Device {
    Device::Cpu
}

fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Gradients of `L = Σ_i c_i θ_i²` for every variable: `2 c ⊙ θ`.
fn quadratic_grads(vars: &[(&Var, &[f64])]) -> GradStore {
    let mut total: Option<Tensor> = None;
    for (v, c) in vars {
        let c = Tensor::new(*c, &cpu()).unwrap();
        let term = (v.as_tensor().sqr().unwrap() * c)
            .unwrap()
            .sum_all()
            .unwrap();
        total = Some(match total {
            None => term,
            Some(t) => (t + term).unwrap(),
        });
    }
    total.unwrap().backward().unwrap()
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x - y).abs() <= tol * y.abs().max(1.0),
            "{what}: {a:?} vs {b:?}"
        );
    }
}

/// Adam / AdamW by hand, in scalars, as PyTorch's documentation writes it.
fn adam_by_hand(
    theta0: &[f64],
    c: &[f64],
    lr: f64,
    cfg: AdamConfig,
    decoupled: bool,
    steps: usize,
) -> Vec<f64> {
    let mut theta = theta0.to_vec();
    let mut m = vec![0.0; theta.len()];
    let mut v = vec![0.0; theta.len()];
    for t in 1..=steps {
        for i in 0..theta.len() {
            let mut g = 2.0 * c[i] * theta[i];
            if decoupled {
                theta[i] *= 1.0 - lr * cfg.weight_decay;
            } else {
                g += cfg.weight_decay * theta[i];
            }
            m[i] = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g;
            v[i] = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * g * g;
            let m_hat = m[i] / (1.0 - cfg.beta1.powi(t as i32));
            let v_hat = v[i] / (1.0 - cfg.beta2.powi(t as i32));
            theta[i] -= lr * m_hat / (v_hat.sqrt() + cfg.eps);
        }
    }
    theta
}

/// SGD by hand, as PyTorch's documentation writes it.
fn sgd_by_hand(theta0: &[f64], c: &[f64], lr: f64, cfg: SgdConfig, steps: usize) -> Vec<f64> {
    let mut theta = theta0.to_vec();
    let mut buf: Vec<Option<f64>> = vec![None; theta.len()];
    for _ in 0..steps {
        for i in 0..theta.len() {
            let mut g = 2.0 * c[i] * theta[i] + cfg.weight_decay * theta[i];
            if cfg.momentum != 0.0 {
                let b = match buf[i] {
                    None => g,
                    Some(b) => cfg.momentum * b + (1.0 - cfg.dampening) * g,
                };
                buf[i] = Some(b);
                g = if cfg.nesterov {
                    g + cfg.momentum * b
                } else {
                    b
                };
            }
            theta[i] -= lr * g;
        }
    }
    theta
}

fn run_optimizer(
    algorithm: Algorithm,
    lr: f64,
    theta0: &[f64],
    c: &[f64],
    steps: usize,
) -> Vec<f64> {
    let theta = Var::new(theta0, &cpu()).unwrap();
    let mut opt = Optimizer::new(vec![ParamGroup {
        name: "all".into(),
        algorithm,
        lr,
        params: vec![("theta".into(), theta.clone())],
    }])
    .unwrap();
    for _ in 0..steps {
        let g = quadratic_grads(&[(&theta, c)]);
        opt.step(&g).unwrap();
    }
    values(theta.as_tensor())
}

const THETA0: [f64; 4] = [1.0, -2.0, 0.5, 3.0];
const C: [f64; 4] = [0.5, 0.25, -1.0, 0.1];

#[test]
fn adam_first_step_by_hand() {
    // θ = 1, c = 0.5: g = 2·0.5·1 + λ·1 = 1.1 with λ = 0.1 (coupled L2); the bias-corrected
    // first step is θ − lr · g / (|g| + ε) = 1 − 0.01 · 1.1 / (1.1 + 1e-8).
    let cfg = AdamConfig {
        weight_decay: 0.1,
        ..AdamConfig::default()
    };
    let got = run_optimizer(Algorithm::Adam(cfg), 0.01, &[1.0], &[0.5], 1);
    let expected = 1.0 - 0.01 * 1.1 / (1.1 + 1e-8);
    assert!((got[0] - expected).abs() < 1e-15, "{got:?} vs {expected}");
    // AdamW: θ ← θ(1 − lr·λ) = 0.999, then θ − lr · g / (|g| + ε) with g = 1 (no L2 in g).
    let got = run_optimizer(Algorithm::AdamW(cfg), 0.01, &[1.0], &[0.5], 1);
    let expected = 0.999 - 0.01 * 1.0 / (1.0 + 1e-8);
    assert!((got[0] - expected).abs() < 1e-15, "{got:?} vs {expected}");
}

#[test]
fn adam_and_adamw_match_the_formulas_over_several_steps() {
    let cfg = AdamConfig {
        beta1: 0.8,
        beta2: 0.99,
        eps: 1e-6,
        weight_decay: 0.05,
    };
    for decoupled in [false, true] {
        let algo = if decoupled {
            Algorithm::AdamW(cfg)
        } else {
            Algorithm::Adam(cfg)
        };
        let got = run_optimizer(algo, 0.1, &THETA0, &C, 5);
        let expected = adam_by_hand(&THETA0, &C, 0.1, cfg, decoupled, 5);
        assert_close(&got, &expected, 1e-13, &format!("decoupled = {decoupled}"));
    }
    // Coupled and decoupled weight decay are different algorithms.
    let coupled = run_optimizer(Algorithm::Adam(cfg), 0.1, &THETA0, &C, 5);
    let decoupled = run_optimizer(Algorithm::AdamW(cfg), 0.1, &THETA0, &C, 5);
    assert!(coupled
        .iter()
        .zip(&decoupled)
        .any(|(a, b)| (a - b).abs() > 1e-4));
}

#[test]
fn sgd_momentum_dampening_nesterov_match_the_formulas() {
    // One hand-computed Nesterov step: θ = 1, c = 0.5, λ = 0.1: g = 1.1, buffer = g,
    // update g + 0.9·g = 2.09, θ = 1 − 0.1·2.09.
    let nesterov = SgdConfig {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 0.1,
    };
    let got = run_optimizer(Algorithm::Sgd(nesterov), 0.1, &[1.0], &[0.5], 1);
    assert!((got[0] - (1.0 - 0.1 * 2.09)).abs() < 1e-15, "{got:?}");
    for cfg in [
        SgdConfig::default(),
        SgdConfig {
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
            weight_decay: 1e-2,
        },
        nesterov,
    ] {
        let got = run_optimizer(Algorithm::Sgd(cfg), 0.05, &THETA0, &C, 4);
        let expected = sgd_by_hand(&THETA0, &C, 0.05, cfg, 4);
        assert_close(&got, &expected, 1e-14, &format!("{cfg:?}"));
    }
    let bad = Algorithm::Sgd(SgdConfig {
        momentum: 0.0,
        nesterov: true,
        ..SgdConfig::default()
    });
    let e = Optimizer::new(vec![ParamGroup {
        name: "g".into(),
        algorithm: bad,
        lr: 0.1,
        params: vec![("p".into(), Var::new(&[1f64], &cpu()).unwrap())],
    }])
    .unwrap_err()
    .to_string();
    assert!(e.contains("nesterov"), "{e}");
}

#[test]
fn groups_have_their_own_rates_switches_and_state() {
    let a = Var::new(&THETA0, &cpu()).unwrap();
    let b = Var::new(&THETA0, &cpu()).unwrap();
    let untouched = Var::new(&[5.0f64], &cpu()).unwrap();
    let sgd = Algorithm::Sgd(SgdConfig::default());
    let adam = Algorithm::Adam(AdamConfig::default());
    let mut opt = Optimizer::new(vec![
        ParamGroup {
            name: "backbone".into(),
            algorithm: sgd,
            lr: 0.01,
            params: vec![("a".into(), a.clone()), ("u".into(), untouched.clone())],
        },
        ParamGroup {
            name: "head".into(),
            algorithm: adam,
            lr: 0.02,
            params: vec![("b".into(), b.clone())],
        },
    ])
    .unwrap();
    // Step 1 with the backbone off (HAPPIER warm-up), then 2 steps with both on.
    opt.set_enabled("backbone", false).unwrap();
    opt.step(&quadratic_grads(&[(&a, &C), (&b, &C)])).unwrap();
    assert_eq!(values(a.as_tensor()), THETA0.to_vec());
    opt.set_enabled("backbone", true).unwrap();
    for _ in 0..2 {
        opt.step(&quadratic_grads(&[(&a, &C), (&b, &C)])).unwrap();
    }
    assert_close(
        &values(a.as_tensor()),
        &sgd_by_hand(&THETA0, &C, 0.01, SgdConfig::default(), 2),
        1e-14,
        "a",
    );
    let expected_b = adam_by_hand(&THETA0, &C, 0.02, AdamConfig::default(), false, 3);
    assert_close(&values(b.as_tensor()), &expected_b, 1e-13, "b");
    // `u` never had a gradient: unchanged, and its step count was not advanced.
    assert_eq!(values(untouched.as_tensor()), vec![5.0]);
    let states = opt.group_states();
    assert_eq!(states[0].steps["a"], 2);
    assert_eq!(states[0].steps["u"], 0);
    assert_eq!(states[1].steps["b"], 3);
    // Duplicates are refused.
    let dup = Optimizer::new(vec![
        ParamGroup {
            name: "x".into(),
            algorithm: sgd,
            lr: 0.1,
            params: vec![("a".into(), a.clone())],
        },
        ParamGroup {
            name: "y".into(),
            algorithm: sgd,
            lr: 0.1,
            params: vec![("a".into(), a)],
        },
    ]);
    assert!(dup
        .unwrap_err()
        .to_string()
        .contains("`a` is in two groups"));
}

#[test]
fn optimizer_state_round_trips() {
    let cfg = Algorithm::Adam(AdamConfig::default());
    let make = |theta: &Var| {
        Optimizer::new(vec![ParamGroup {
            name: "g".into(),
            algorithm: cfg,
            lr: 0.05,
            params: vec![("t".into(), theta.clone())],
        }])
        .unwrap()
    };
    let straight = Var::new(&THETA0, &cpu()).unwrap();
    let mut opt = make(&straight);
    for _ in 0..4 {
        opt.step(&quadratic_grads(&[(&straight, &C)])).unwrap();
    }
    let resumed = Var::new(&THETA0, &cpu()).unwrap();
    let mut first = make(&resumed);
    for _ in 0..2 {
        first.step(&quadratic_grads(&[(&resumed, &C)])).unwrap();
    }
    let tensors = first.state_tensors().unwrap().into_iter().collect();
    let mut second = make(&resumed);
    second
        .load_state(&first.group_states(), &tensors, std::path::Path::new("mem"))
        .unwrap();
    for _ in 0..2 {
        second.step(&quadratic_grads(&[(&resumed, &C)])).unwrap();
    }
    assert_eq!(values(straight.as_tensor()), values(resumed.as_tensor()));
}

#[test]
fn chunked_large_batch_gradient_equals_the_direct_gradient() {
    // f64 so that the only difference, the summation order, is far below the tolerance.
    let store = ParamStore::new(5);
    let cfg = EmbeddingNetConfig {
        backbone: BackboneConfig::SmallCnn(SmallCnnConfig {
            widths: vec![4, 6],
            frozen_bn: true,
            ..SmallCnnConfig::default()
        }),
        head: EmbeddingHeadConfig {
            dim: 8,
            ..EmbeddingHeadConfig::default()
        },
    };
    let net = EmbeddingNet::new(&cfg, store.var_builder(DType::F64, &cpu())).unwrap();
    let x = Tensor::randn(0f64, 1.0, (10, 3, 8, 8), &cpu()).unwrap();
    let labels = Labels::from_fine(&[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]).unwrap();
    let loss = Contrastive { margin: 0.1 };
    let forward = |x: &Tensor| net.forward_t(x, true);
    let (l_direct, g_direct) = direct_gradients(&forward, &x, &labels, &loss).unwrap();
    for chunk in [1, 3, 4, 10] {
        let (l_chunk, g_chunk) = chunked_gradients(&forward, &x, &labels, &loss, chunk).unwrap();
        assert!(
            (l_direct - l_chunk).abs() < 1e-14,
            "loss {l_direct} vs {l_chunk}"
        );
        let mut checked = 0;
        for (name, var) in store.trainable("") {
            let a = values(g_direct.get(var.as_tensor()).unwrap());
            let b = values(g_chunk.get(var.as_tensor()).unwrap());
            let scale = a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert!(scale > 0.0, "{name} has a zero gradient");
            assert_close(
                &b,
                &a,
                1e-11 * scale.max(1e-3),
                &format!("chunk {chunk}: {name}"),
            );
            checked += 1;
        }
        assert_eq!(checked, store.trainable("").len());
    }
    assert!(chunked_gradients(&forward, &x, &labels, &loss, 0).is_err());
}

/// A run small enough for a test: 16 fine classes × 6 images of 16 × 16, half for training.
fn tiny_config() -> TrainConfig {
    TrainConfig {
        seed: 3,
        dataset: DatasetConfig::Embedded(EmbeddedConfig {
            seed: 0,
            families: 2,
            variants_per_family: 2,
            fine_per_variant: 4,
            images_per_class: 6,
            image_size: 16,
            split_level: 1,
            levels: 3,
        }),
        model: EmbeddingNetConfig {
            backbone: BackboneConfig::SmallCnn(SmallCnnConfig {
                widths: vec![4, 8],
                ..SmallCnnConfig::default()
            }),
            head: EmbeddingHeadConfig {
                dim: 16,
                ..EmbeddingHeadConfig::default()
            },
        },
        sampler: SamplerConfig::MPerClass {
            batch_size: 8,
            samples_per_class: 2,
            level: 0,
            batches_per_epoch: None,
            shuffle_within_batch: true,
        },
        epochs: 2,
        optimizer: OptimizerConfig {
            backbone: GroupConfig {
                lr: 0.05,
                algorithm: Algorithm::Sgd(SgdConfig {
                    momentum: 0.9,
                    dampening: 0.0,
                    nesterov: true,
                    weight_decay: 1e-4,
                }),
            },
            head: GroupConfig {
                lr: 1e-2,
                algorithm: Algorithm::Adam(AdamConfig {
                    weight_decay: 4e-4,
                    ..AdamConfig::default()
                }),
            },
            ..OptimizerConfig::default()
        },
        schedule: LrSchedule {
            decay: Decay::Cosine {
                t_max: 3,
                eta_min: 1e-4,
                torch_recursive: false,
            },
            ..LrSchedule::default()
        },
        eval: EvalConfig {
            every: 1,
            at_start: true,
            recall_ks: vec![1, 4],
            batch_size: 20,
        },
        progress: false,
        ..TrainConfig::default()
    }
}

fn snapshot(store: &ParamStore) -> Vec<(String, Vec<u64>)> {
    store
        .all()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                values(v.as_tensor())
                    .into_iter()
                    .map(f64::to_bits)
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn resume_continues_bit_identically() {
    let loss = Contrastive { margin: 0.2 };
    let mut config = tiny_config();
    config.backbone_warmup_epochs = 1;
    config.epochs = 3;

    let mut straight = Trainer::new(config.clone(), &loss).unwrap();
    let report = straight.fit().unwrap();
    assert_eq!(report.epochs.len(), 3);
    assert!(report.epochs[0].backbone_frozen && !report.epochs[1].backbone_frozen);

    let dir = tempfile::tempdir().unwrap();
    let mut first = config.clone();
    first.epochs = 1;
    first.output = OutputConfig {
        dir: Some(dir.path().to_path_buf()),
        checkpoint_every: 1,
    };
    let mut t1 = Trainer::new(first, &loss).unwrap();
    t1.fit().unwrap();
    let ckpt = t1.checkpoint_path().unwrap();
    assert!(ckpt.exists());
    drop(t1);

    let mut second = config.clone();
    second.resume = Some(ckpt.clone());
    let mut t2 = Trainer::new(second, &loss).unwrap();
    assert_eq!(t2.epochs_done(), 1);
    t2.fit().unwrap();

    assert_eq!(snapshot(straight.params()), snapshot(t2.params()));
    let a = straight.optimizer().state_tensors().unwrap();
    let b = t2.optimizer().state_tensors().unwrap();
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        let (va, vb) = (values(ta), values(tb));
        assert!(
            va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{na}"
        );
    }
    assert_eq!(
        straight.optimizer().group_states(),
        t2.optimizer().group_states()
    );
    assert_eq!(straight.global_step(), t2.global_step());
    // The logged losses and evaluations agree too (timings aside).
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

    // A checkpoint of another model is refused with the field named.
    let mut other = config;
    other.model.head.dim = 8;
    other.resume = Some(ckpt);
    let e = Trainer::new(other, &loss).err().unwrap().to_string();
    assert!(
        e.contains("checkpoint.safetensors") && e.contains("`model`"),
        "{e}"
    );
}

#[test]
fn a_pretrain_stage_is_the_run_of_its_recipe() {
    use rankwise::losses::norm_softmax::NormSoftmaxConfig;
    let mut fine = tiny_config();
    fine.loss = LossConfig::Contrastive(rankwise::losses::contrastive::Contrastive::default());
    fine.epochs = 1;
    fine.pretrain = Some(PretrainStage {
        loss: LossConfig::NormSoftmax(NormSoftmaxConfig::default()),
        epochs: 2,
        sampler: None,
        optimizer: None,
        schedule: Some(LrSchedule::default()),
    });
    let stage = fine.pretrain_recipe().unwrap();
    assert_eq!(stage.loss, fine.pretrain.as_ref().unwrap().loss);
    assert_eq!(
        (stage.epochs, stage.schedule.clone()),
        (2, LrSchedule::default())
    );
    assert_eq!((&stage.sampler, stage.seed), (&fine.sampler, fine.seed));
    assert!(stage.pretrain.is_none());

    // The stage as a run of its own: its network and its last evaluation.
    let mut alone = Trainer::from_config(stage.clone()).unwrap();
    let untrained = snapshot(alone.params());
    alone.fit().unwrap();
    let pretrained = snapshot(alone.params());
    assert_ne!(untrained, pretrained, "the stage trained");

    // The fine-tuning run starts from that network, bit for bit, and its evaluation before
    // the first epoch is the stage's last one.
    let mut tuned = Trainer::from_config(fine.clone()).unwrap();
    assert_eq!(snapshot(tuned.params()), pretrained);
    tuned.fit().unwrap();
    for (metric, level) in [("R@1", Some(0)), ("H-AP", None)] {
        let before = tuned.log().series("test", metric, level)[0];
        let last = *alone.log().series("test", metric, level).last().unwrap();
        assert_eq!(before.0, 0);
        assert_eq!(before.1.to_bits(), last.1.to_bits(), "{metric}");
    }
    assert_ne!(snapshot(tuned.params()), pretrained, "the run fine-tuned");

    // The recipe round-trips through TOML with its stage; a bad stage names itself.
    let text = fine.to_toml_string().unwrap();
    assert!(
        text.contains("[pretrain]") && text.contains("[pretrain.loss]"),
        "{text}"
    );
    let back: TrainConfig = toml::from_str(&text).unwrap();
    assert_eq!(back, fine);
    let mut bad = fine.clone();
    bad.pretrain.as_mut().unwrap().epochs = 0;
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("pretrain") && e.contains("epochs"), "{e}");
    let e = toml::from_str::<TrainConfig>("[pretrain]\nepochs = 2\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("loss"), "{e}");

    // A checkpoint of a run with another stage is refused with the field named.
    let dir = tempfile::tempdir().unwrap();
    let mut saved = fine.clone();
    saved.output.dir = Some(dir.path().to_path_buf());
    let mut t = Trainer::from_config(saved).unwrap();
    t.fit().unwrap();
    let mut other = fine;
    other.pretrain.as_mut().unwrap().epochs = 1;
    other.resume = t.checkpoint_path();
    let e = Trainer::from_config(other).err().unwrap().to_string();
    assert!(e.contains("`pretrain`"), "{e}");
}

fn loss_vars_bits(trainer: &Trainer) -> Vec<(String, Vec<u64>)> {
    trainer
        .loss()
        .trainable_vars()
        .into_iter()
        .map(|(n, v)| {
            let bits = values(v.as_tensor()).into_iter().map(f64::to_bits);
            (n, bits.collect())
        })
        .collect()
}

/// Losses built from the recipe, with their own variables (HAPPIER's and CSL's proxies, in the
/// `loss` parameter group) and their own state (RaMBO's score memory), resume bit-identically
/// too.
#[test]
fn losses_from_the_config_with_proxies_or_memory_resume_bit_identically() {
    let happier = LossConfig::Happier(HappierConfig::default());
    let rambo = LossConfig::Rambo(RamboConfig {
        memory: 2,
        half_normal_margin: true,
        ..RamboConfig::default()
    });
    let csl = LossConfig::Csl(CslConfig::default());
    for loss in [happier, csl, rambo] {
        let mut config = tiny_config();
        config.loss = loss.clone();
        config.epochs = 2;
        config.eval.at_start = false;
        let mut straight = Trainer::from_config(config.clone()).unwrap();
        straight.fit().unwrap();
        let has_proxies = matches!(loss, LossConfig::Happier(_) | LossConfig::Csl(_));
        assert_eq!(
            straight.optimizer().group_names().contains(&"loss"),
            has_proxies,
            "{}",
            loss.name()
        );

        let dir = tempfile::tempdir().unwrap();
        let mut first = config.clone();
        first.epochs = 1;
        first.output = OutputConfig {
            dir: Some(dir.path().to_path_buf()),
            checkpoint_every: 1,
        };
        let mut t1 = Trainer::from_config(first).unwrap();
        t1.fit().unwrap();
        let ckpt = t1.checkpoint_path().unwrap();
        drop(t1);
        let mut second = config.clone();
        second.resume = Some(ckpt.clone());
        let mut t2 = Trainer::from_config(second).unwrap();
        t2.fit().unwrap();

        assert_eq!(
            snapshot(straight.params()),
            snapshot(t2.params()),
            "{}",
            loss.name()
        );
        assert_eq!(
            loss_vars_bits(&straight),
            loss_vars_bits(&t2),
            "{}",
            loss.name()
        );
        assert_eq!(
            straight.loss().state_json().unwrap(),
            t2.loss().state_json().unwrap(),
            "{}",
            loss.name()
        );
        assert_eq!(
            straight.log().series("train", "loss", None),
            t2.log().series("train", "loss", None),
            "{}",
            loss.name()
        );
        if has_proxies {
            // The proxies were trained.
            let fresh = Trainer::from_config(config.clone()).unwrap();
            assert_ne!(loss_vars_bits(&fresh), loss_vars_bits(&straight));
        }

        // Resuming with another loss is refused with the field named.
        let mut other = config;
        other.loss = LossConfig::default();
        other.resume = Some(ckpt);
        let e = Trainer::from_config(other).err().unwrap().to_string();
        assert!(e.contains("`loss`"), "{e}");
    }
}

#[test]
fn warmup_freezes_the_backbone_and_outputs_are_written() {
    let loss = Contrastive { margin: 0.2 };
    let dir = tempfile::tempdir().unwrap();
    let mut config = tiny_config();
    config.epochs = 1;
    config.backbone_warmup_epochs = 1;
    config.output.dir = Some(dir.path().join("run"));
    let mut t = Trainer::new(config, &loss).unwrap();
    let before = snapshot(t.params());
    let report = t.fit().unwrap();
    let after = snapshot(t.params());
    for ((name, a), (_, b)) in before.iter().zip(&after) {
        let trainable_backbone = name.starts_with("backbone.") && !name.contains("running_");
        if trainable_backbone {
            assert_eq!(a, b, "{name} moved during the warm-up");
        }
        if name.starts_with("head.") {
            assert_ne!(a, b, "{name} did not learn");
        }
    }
    // The evaluation before and after training is in the log and the CSV.
    let r1 = report.log.series("test", "R@1", Some(0));
    assert_eq!(r1.iter().map(|(e, _)| *e).collect::<Vec<_>>(), vec![0, 1]);
    assert!(r1.iter().all(|(_, v)| (0.0..=1.0).contains(v)));
    let csv = std::fs::read_to_string(dir.path().join("run/metrics.csv")).unwrap();
    assert!(
        csv.starts_with("epoch,step,split,metric,level,value\n"),
        "{csv}"
    );
    assert!(
        csv.lines()
            .any(|l| l.starts_with("1,") && l.contains(",test,R@1,0,")),
        "{csv}"
    );
    assert!(dir.path().join("run/metrics.parquet").exists());
    assert!(dir.path().join("run/checkpoint.safetensors").exists());
}

#[test]
fn bad_settings_fail_with_the_field_named() {
    let loss = Contrastive { margin: 0.2 };
    let mut config = tiny_config();
    config.large_batch_chunk = Some(4);
    let e = Trainer::new(config, &loss).err().unwrap().to_string();
    assert!(
        e.contains("large_batch_chunk") && e.contains("frozen_bn"),
        "{e}"
    );
    let mut config = tiny_config();
    config.sampler = SamplerConfig::MPerClass {
        batch_size: 7,
        samples_per_class: 2,
        level: 0,
        batches_per_epoch: None,
        shuffle_within_batch: true,
    };
    let e = Trainer::new(config, &loss).err().unwrap().to_string();
    assert!(e.contains("batch_size"), "{e}");
    let mut config = tiny_config();
    config.pretrained = Some("/nonexistent/weights.safetensors".into());
    let e = Trainer::new(config, &loss).err().unwrap().to_string();
    assert!(e.contains("/nonexistent/weights.safetensors"), "{e}");
}

#[test]
fn chunked_training_with_frozen_bn_runs() {
    let loss = Contrastive { margin: 0.2 };
    let mut config = tiny_config();
    config.epochs = 1;
    config.eval.at_start = false;
    config.large_batch_chunk = Some(3);
    if let BackboneConfig::SmallCnn(c) = &mut config.model.backbone {
        c.frozen_bn = true;
    }
    let mut t = Trainer::new(config, &loss).unwrap();
    let report = t.fit().unwrap();
    assert!(report.epochs[0].mean_loss.is_finite());
    assert_eq!(report.log.series("test", "R@1", Some(0)).len(), 1);
}

/// The loss kinds a ready recipe's comment lists are the kinds the recipe reader takes (a comment
/// once said `fastap` where the value is `fast_ap`).
#[test]
fn the_loss_kinds_listed_in_the_recipes_are_valid() {
    for recipe in ["embedded_small_cnn.toml", "embedded_smooth_ap.toml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("configs")
            .join(recipe);
        let text = std::fs::read_to_string(&path).unwrap();
        let listed: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("# The loss: kind = "))
            .take(2)
            .flat_map(|l| l.trim_start_matches("# The loss: kind = ").split('|'))
            .map(|k| {
                k.trim_start_matches('#')
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
            })
            .filter(|k| !k.is_empty())
            .collect();
        assert_eq!(listed.len(), 9, "{recipe}: {listed:?}");
        for kind in listed {
            // A kind may need fields of its own (`summed` its `base`): only an unknown kind fails.
            if let Err(e) =
                rankwise::train::load_with_overrides(&path, &[format!("loss.kind={kind}")])
            {
                let e = e.to_string();
                assert!(!e.contains("unknown variant"), "{recipe}: `{kind}`: {e}");
            }
        }
        let e = rankwise::train::load_with_overrides(&path, &["loss.kind=fastap".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant"), "{e}");
    }
}

/// `[validation]`: held-out classes out of everything that trains, evaluated at each
/// evaluation, the epoch of their best value selected, its test metrics reported and its network
/// kept (`best.safetensors`, which gives the same metrics when evaluated again).
#[test]
fn held_out_classes_select_the_epoch_and_keep_its_network() {
    use rankwise::losses::norm_softmax::NormSoftmaxConfig;
    use rankwise::train::validation::{held_out_classes, select};
    use rankwise::train::ValidationConfig;
    use std::collections::BTreeSet;
    let classes = |labels: &Labels| -> BTreeSet<i64> { labels.column(0).into_iter().collect() };
    let validation = ValidationConfig {
        fraction: Some(0.25),
        seed: 7,
        metric: "R@1".into(),
        patience: None,
        ..ValidationConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = tiny_config();
    config.epochs = 3;
    // A proxy loss: one proxy per training class, so the held-out classes must not have one.
    config.loss = LossConfig::NormSoftmax(NormSoftmaxConfig::default());
    let plain = Trainer::from_config(config.clone()).unwrap();
    let all_train = classes(plain.train_set().labels());
    assert_eq!(all_train.len(), 8);
    assert!(plain
        .split_source("val")
        .err()
        .unwrap()
        .to_string()
        .contains("[validation]"));
    config.validation = Some(validation.clone());
    config.output.dir = Some(dir.path().join("run"));
    let mut t = Trainer::from_config(config.clone()).unwrap();
    let kept = classes(t.train_set().labels());
    let held = classes(t.split_source("val").unwrap().labels());
    assert_eq!(
        held,
        held_out_classes(plain.train_set().labels(), &validation).unwrap()
    );
    assert_eq!((kept.len(), held.len()), (6, 2));
    assert!(kept.is_disjoint(&held));
    assert_eq!(
        kept.union(&held).copied().collect::<BTreeSet<_>>(),
        all_train
    );
    assert_eq!(t.split_source("val").unwrap().len(), 2 * 6);
    let proxies = t.loss().trainable_vars();
    assert_eq!(
        proxies[0].1.as_tensor().dim(0).unwrap(),
        6,
        "a proxy per kept class"
    );

    t.keep_selected_test_embeddings().unwrap();
    let report = t.fit().unwrap();
    let val = report.log.series("val", "R@1", Some(0));
    assert_eq!(
        val.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    let s = report.selection.clone().unwrap();
    assert_eq!(Some(&s), select(report.log.rows(), "R@1", Some(0)).as_ref());
    let best = val.iter().map(|(_, v)| *v).fold(f64::MIN, f64::max);
    assert_eq!(s.value, best);
    assert_eq!(s.epoch, val.iter().find(|(_, v)| *v == best).unwrap().0);
    let test_r1 = report.log.series("test", "R@1", Some(0));
    let at_selected = test_r1.iter().find(|(e, _)| *e == s.epoch).unwrap().1;
    assert_eq!(s.test("test", "R@1", Some(0)), Some(at_selected));
    assert!(s.test_metrics.iter().all(|r| r.split == "test"));

    // The kept network is the selected epoch's: evaluated again, the same bits.
    let kept_file = dir.path().join("run/best.safetensors");
    assert!(kept_file.is_file());
    let mut again = config.clone();
    again.output.dir = None;
    again.resume = Some(kept_file.clone());
    let mut t2 = Trainer::from_config(again).unwrap();
    assert_eq!(t2.epochs_done(), s.epoch);
    let e = t2.evaluate().unwrap();
    assert_eq!(
        e.validation
            .as_ref()
            .unwrap()
            .get("R@1", Some(0))
            .unwrap()
            .to_bits(),
        s.value.to_bits()
    );
    assert_eq!(
        e.report("test")
            .unwrap()
            .get("R@1", Some(0))
            .unwrap()
            .to_bits(),
        at_selected.to_bits()
    );
    // The kept test embeddings are that network's, and give every selected test metric.
    let (epoch, embedded) = t.selected_test_embeddings().unwrap();
    assert_eq!(epoch, s.epoch);
    let (again, _) = t2.embed_split("test").unwrap();
    assert_eq!(
        embedded.queries.to_vec2::<f32>().unwrap(),
        again.to_vec2::<f32>().unwrap()
    );
    let opts = rankwise::retrieval::EvalOptions {
        recall_ks: config.eval.recall_ks.clone(),
        ..Default::default()
    };
    let rows = embedded.evaluate(&opts).unwrap().rows;
    assert_eq!(rows.len(), s.test_metrics.len());
    for (r, logged) in rows.iter().zip(&s.test_metrics) {
        assert_eq!((&r.metric, r.level), (&logged.metric, logged.level));
        assert_eq!(r.value.to_bits(), logged.value.to_bits(), "{}", r.metric);
    }
    // Nothing selects an epoch without held-out classes.
    let mut without = config.clone();
    without.validation = None;
    without.output.dir = None;
    let e = Trainer::from_config(without)
        .unwrap()
        .keep_selected_test_embeddings()
        .unwrap_err()
        .to_string();
    assert!(e.contains("[validation]"), "{e}");
    // A checkpoint holds its held-out classes: resuming it without them, or with others, fails.
    for other in [
        None,
        Some(ValidationConfig {
            seed: 8,
            ..validation.clone()
        }),
    ] {
        let mut c = config.clone();
        c.output.dir = None;
        c.validation = other;
        c.resume = Some(kept_file.clone());
        let e = Trainer::from_config(c).err().unwrap().to_string();
        assert!(e.contains("`validation`"), "{e}");
    }
}

#[test]
fn a_validation_metric_the_evaluation_lacks_is_named() {
    use rankwise::train::ValidationConfig;
    let loss = Contrastive { margin: 0.2 };
    let mut config = tiny_config();
    config.epochs = 1;
    // R@8 is not in eval.recall_ks: refused before anything runs.
    config.validation = Some(ValidationConfig {
        fraction: Some(0.25),
        seed: 0,
        metric: "R@8".into(),
        patience: None,
        ..ValidationConfig::default()
    });
    let e = Trainer::new(config.clone(), &loss)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("validation.metric") && e.contains("eval.recall_ks"),
        "{e}"
    );
    // A level the labels do not have: named once the data is known, before training.
    config.validation = Some(ValidationConfig {
        fraction: Some(0.25),
        seed: 0,
        metric: "mAP@R:5".into(),
        patience: None,
        ..ValidationConfig::default()
    });
    let e = Trainer::new(config.clone(), &loss)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("validation.metric") && e.contains("mAP@R:5") && e.contains("0..3"),
        "{e}"
    );
    // Too few training classes to hold any out.
    config.validation = Some(ValidationConfig {
        fraction: Some(0.1),
        ..ValidationConfig::default()
    });
    let e = Trainer::new(config, &loss).err().unwrap().to_string();
    assert!(
        e.contains("validation.fraction") && e.contains("8 fine classes"),
        "{e}"
    );
}

/// A run with `[validation]` stopped after one epoch and resumed selects the epoch a run that
/// never stopped selects, and keeps the same network in `best.safetensors`.
#[test]
fn a_resumed_run_selects_as_one_that_never_stopped() {
    use rankwise::train::ValidationConfig;
    let loss = Contrastive { margin: 0.2 };
    let mut config = tiny_config();
    config.epochs = 4;
    config.validation = Some(ValidationConfig {
        fraction: Some(0.25),
        seed: 2,
        metric: "mAP@R".into(),
        patience: None,
        ..ValidationConfig::default()
    });
    let straight_dir = tempfile::tempdir().unwrap();
    let mut straight = config.clone();
    straight.output.dir = Some(straight_dir.path().to_path_buf());
    let a = Trainer::new(straight, &loss).unwrap().fit().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut first = config.clone();
    first.epochs = 1;
    first.output.dir = Some(dir.path().to_path_buf());
    Trainer::new(first, &loss).unwrap().fit().unwrap();
    let mut second = config;
    second.output.dir = Some(dir.path().to_path_buf());
    second.resume = Some(dir.path().join("checkpoint.safetensors"));
    let b = Trainer::new(second, &loss).unwrap().fit().unwrap();

    assert_eq!(a.selection, b.selection);
    assert!(a.selection.is_some());
    assert_eq!(
        a.log.series("val", "mAP@R", Some(0)),
        b.log.series("val", "mAP@R", Some(0))
    );
    // The kept networks: the same variables, bit for bit.
    let read = |d: &std::path::Path| {
        let t = candle_core::safetensors::load(d.join("best.safetensors"), &cpu()).unwrap();
        let mut v: Vec<(String, Vec<u64>)> = t
            .into_iter()
            .filter(|(k, _)| k.starts_with("model."))
            .map(|(k, t)| (k, values(&t).into_iter().map(f64::to_bits).collect()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(read(straight_dir.path()), read(dir.path()));
}

/// A checkpoint of one fold resumes only with the same fold: another fold holds other classes
/// out (the first fold's network trained on them), while a changed patience is accepted.
#[test]
fn a_fold_resumes_only_as_the_same_fold() {
    use rankwise::train::ValidationConfig;
    let loss = Contrastive { margin: 0.2 };
    let fold = |f, patience| ValidationConfig {
        folds: Some(2),
        fold: Some(f),
        patience,
        ..ValidationConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut first = tiny_config();
    first.epochs = 1;
    first.validation = Some(fold(0, None));
    first.output.dir = Some(dir.path().to_path_buf());
    Trainer::new(first.clone(), &loss).unwrap().fit().unwrap();
    let resume = |validation: ValidationConfig| {
        let mut c = first.clone();
        c.epochs = 2;
        c.validation = Some(validation);
        c.resume = Some(dir.path().join("checkpoint.safetensors"));
        Trainer::new(c, &loss).map(|_| ())
    };
    let e = resume(fold(1, None)).unwrap_err().to_string();
    assert!(e.contains("another `validation`"), "{e}");
    assert!(resume(fold(0, Some(3))).is_ok());
}

/// `[validation] patience`: the run stops once that many evaluations bring no better validation
/// value, having trained exactly what the same run without patience trains in those epochs (bit
/// for bit); its checkpoint is of the stopping epoch, and resuming it — with more epochs, or
/// another patience — trains nothing more, while a longer patience continues it as a run that
/// never stopped.
#[test]
fn patience_stops_the_run_and_a_resume_stays_stopped() {
    use rankwise::train::validation::patience_spent;
    use rankwise::train::ValidationConfig;
    let loss = Contrastive { margin: 0.2 };
    let mut config = tiny_config();
    config.epochs = 8;
    let validation = ValidationConfig {
        fraction: Some(0.25),
        seed: 2,
        metric: "mAP@R".into(),
        patience: Some(1),
        ..ValidationConfig::default()
    };
    config.validation = Some(validation.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut stopping = config.clone();
    stopping.output.dir = Some(dir.path().to_path_buf());
    let a = Trainer::new(stopping.clone(), &loss)
        .unwrap()
        .fit()
        .unwrap();
    let stop = a.epochs.len() as u64;
    let selected = a.selection.as_ref().unwrap().epoch;
    assert!(
        stop < 8,
        "the tiny run never stopped: {:?}",
        a.log.series("val", "mAP@R", Some(0))
    );
    assert_eq!(
        stop,
        selected + 1,
        "patience 1 stops one evaluation after the best"
    );
    assert!(patience_spent(a.log.rows(), "mAP@R", Some(0), 1));

    // The run without patience trains the same first `stop` epochs, bit for bit.
    let mut full = config.clone();
    full.validation = Some(ValidationConfig {
        patience: None,
        ..validation.clone()
    });
    let b = Trainer::new(full, &loss).unwrap().fit().unwrap();
    assert_eq!(b.epochs.len(), 8);
    let bits = |rows: Vec<(u64, f64)>, upto: u64| -> Vec<(u64, u64)> {
        rows.into_iter()
            .filter(|(e, _)| *e <= upto)
            .map(|(e, v)| (e, v.to_bits()))
            .collect()
    };
    for (split, metric) in [("val", "mAP@R"), ("test", "R@1"), ("train", "loss_mean")] {
        let level = (split != "train").then_some(0);
        assert_eq!(
            bits(a.log.series(split, metric, level), stop),
            bits(b.log.series(split, metric, level), stop),
            "{split} {metric}"
        );
    }

    // Resumed with more epochs: nothing more trains, and the selection is the same.
    let mut resumed = stopping.clone();
    resumed.epochs = 12;
    resumed.resume = Some(dir.path().join("checkpoint.safetensors"));
    let mut trainer = Trainer::new(resumed.clone(), &loss).unwrap();
    assert_eq!(trainer.epochs_done(), stop);
    let c = trainer.fit().unwrap();
    assert!(c.epochs.is_empty());
    assert_eq!(c.selection, a.selection);
    // A longer patience continues it, as the run without patience trained.
    resumed.validation = Some(ValidationConfig {
        patience: Some(100),
        ..validation
    });
    resumed.epochs = 8;
    let d = Trainer::new(resumed, &loss).unwrap().fit().unwrap();
    assert_eq!(d.epochs.len() as u64, 8 - stop);
    assert_eq!(
        bits(d.log.series("val", "mAP@R", Some(0)), 8),
        bits(b.log.series("val", "mAP@R", Some(0)), 8)
    );
}

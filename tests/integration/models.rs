//! Backbones, embedding head, seeded initialisation and pretrained-weight loading.

use candle_core::{DType, Device, Tensor};
use rankwise::models::layers::Pooling;
use rankwise::models::{
    BackboneConfig, EmbeddingHeadConfig, EmbeddingNet, EmbeddingNetConfig, ParamStore, ResNet,
    ResNetConfig, ResNetDepth, SmallCnnConfig, BACKBONE_PREFIX, HEAD_PREFIX,
};
use std::collections::HashMap;

fn cpu() -> Device {
    Device::Cpu
}

fn shapes(store: &ParamStore) -> HashMap<String, Vec<usize>> {
    store
        .all()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().dims().to_vec()))
        .collect()
}

/// Parameter counts of torchvision's `resnet18/34/50()` minus the 1000-way classifier
/// (`fc`: 512·1000 + 1000 or 2048·1000 + 1000): 11,689,512 − 513,000, 21,797,672 − 513,000,
/// 25,557,032 − 2,049,000.
#[test]
fn resnets_have_torchvision_names_shapes_and_sizes() {
    for (depth, expected_params, expected_tensors) in [
        (ResNetDepth::Resnet18, 11_176_512, 100),
        (ResNetDepth::Resnet34, 21_284_672, 180),
        (ResNetDepth::Resnet50, 23_508_032, 265),
    ] {
        let store = ParamStore::new(0);
        let cfg = ResNetConfig::new(depth, true);
        ResNet::new(&cfg, store.var_builder(DType::F32, &cpu())).unwrap();
        // Trainable = conv weights + BN affine; buffers (running statistics) excluded.
        assert_eq!(store.num_trainable(""), expected_params, "{depth:?}");
        assert_eq!(store.names().len(), expected_tensors, "{depth:?}");
        let s = shapes(&store);
        assert_eq!(s["conv1.weight"], vec![64, 3, 7, 7]);
        assert_eq!(s["bn1.running_var"], vec![64]);
        assert_eq!(s["layer2.0.downsample.0.weight"].len(), 4);
        match depth {
            ResNetDepth::Resnet50 => {
                assert_eq!(s["layer1.0.conv3.weight"], vec![256, 64, 1, 1]);
                assert_eq!(s["layer1.0.downsample.0.weight"], vec![256, 64, 1, 1]);
                assert_eq!(s["layer4.2.bn3.weight"], vec![2048]);
                assert_eq!(s["layer2.0.conv2.weight"], vec![128, 128, 3, 3]);
            }
            _ => {
                assert_eq!(s["layer1.0.conv1.weight"], vec![64, 64, 3, 3]);
                assert!(!s.contains_key("layer1.0.downsample.0.weight"));
                assert_eq!(s["layer4.1.bn2.running_mean"], vec![512]);
                assert_eq!(s["layer3.0.downsample.0.weight"], vec![256, 128, 1, 1]);
            }
        }
    }
}

#[test]
fn resnet_forward_shapes_follow_torchvision_arithmetic() {
    let store = ParamStore::new(0);
    let mut cfg = ResNetConfig::new(ResNetDepth::Resnet50, false);
    cfg.base_width = 4;
    let net = ResNet::new(&cfg, store.var_builder(DType::F32, &cpu())).unwrap();
    // 70 → conv 35 → pool 18 → 18, 9, 5, 3 (odd sizes exercise the padding arithmetic).
    let x = Tensor::randn(0f32, 1.0, (2, 3, 70, 70), &cpu()).unwrap();
    let y = net.forward_t(&x, true).unwrap();
    assert_eq!(y.dims(), &[2, 128, 3, 3]);
    assert!(net.uses_batch_statistics());
    let bad = Tensor::zeros((2, 1, 32, 32), DType::F32, &cpu()).unwrap();
    let e = net.forward_t(&bad, false).unwrap_err().to_string();
    assert!(e.contains("B × 3 × H × W"), "{e}");
}

fn small_net(seed: u64, head: EmbeddingHeadConfig) -> (ParamStore, EmbeddingNet) {
    let store = ParamStore::new(seed);
    let cfg = EmbeddingNetConfig {
        backbone: BackboneConfig::SmallCnn(SmallCnnConfig {
            widths: vec![4, 8],
            ..SmallCnnConfig::default()
        }),
        head,
    };
    let net = EmbeddingNet::new(&cfg, store.var_builder(DType::F32, &cpu())).unwrap();
    (store, net)
}

#[test]
fn embedding_net_gives_unit_vectors_and_seeded_weights() {
    let (store, net) = small_net(7, EmbeddingHeadConfig::default());
    let names = store.names();
    assert!(names
        .iter()
        .all(|n| n.starts_with(BACKBONE_PREFIX) || n.starts_with(HEAD_PREFIX)));
    assert!(names.contains(&"head.fc.weight".to_string()));
    assert_eq!(shapes(&store)["head.fc.weight"], vec![512, 8]);
    let x = Tensor::randn(0f32, 1.0, (3, 3, 8, 8), &cpu()).unwrap();
    let e = net.forward_t(&x, false).unwrap();
    assert_eq!(e.dims(), &[3, 512]);
    let norms: Vec<f32> = e.sqr().unwrap().sum(1).unwrap().to_vec1().unwrap();
    assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-5), "{norms:?}");
    // Same seed, same weights; another seed, other weights.
    let (again, _) = small_net(7, EmbeddingHeadConfig::default());
    let (other, _) = small_net(8, EmbeddingHeadConfig::default());
    for (name, var) in store.all() {
        let a: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = again
            .get(&name)
            .unwrap()
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(a, b, "{name}");
        if name.ends_with("conv.weight") || name.ends_with("fc.weight") {
            let c: Vec<f32> = other
                .get(&name)
                .unwrap()
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_ne!(a, c, "{name}");
        }
    }
}

#[test]
fn head_computes_pool_layernorm_linear_normalise() {
    let head_cfg = EmbeddingHeadConfig {
        dim: 2,
        pooling: Pooling::Max,
        layer_norm: true,
        normalize: true,
    };
    let store = ParamStore::new(0);
    let vb = store.var_builder(DType::F32, &cpu());
    let head = rankwise::models::EmbeddingHead::new(3, &head_cfg, vb).unwrap();
    store
        .get("fc.weight")
        .unwrap()
        .set(&Tensor::new(&[[1f32, 0., 2.], [0., -1., 1.]], &cpu()).unwrap())
        .unwrap();
    store
        .get("fc.bias")
        .unwrap()
        .set(&Tensor::new(&[0.5f32, 0.], &cpu()).unwrap())
        .unwrap();
    // One image, 3 channels of 2 × 1: max pooling gives (3, 1, 5).
    let x = Tensor::new(&[1f32, 3., 1., 0., 5., 2.], &cpu())
        .unwrap()
        .reshape((1, 3, 2, 1))
        .unwrap();
    let y: Vec<f32> = head
        .forward(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    // LayerNorm: mean 3, biased var 8/3.
    let s = (8.0f64 / 3.0 + 1e-5).sqrt();
    let z = [0.0, -2.0 / s, 2.0 / s];
    let lin = [z[0] + 2.0 * z[2] + 0.5, -z[1] + z[2]];
    let n = (lin[0] * lin[0] + lin[1] * lin[1]).sqrt();
    assert!(
        (y[0] as f64 - lin[0] / n).abs() < 1e-6 && (y[1] as f64 - lin[1] / n).abs() < 1e-6,
        "{y:?}"
    );
}

#[test]
fn frozen_batch_norm_keeps_statistics_and_trains_affine() {
    for frozen in [true, false] {
        let store = ParamStore::new(0);
        let cfg = EmbeddingNetConfig {
            backbone: BackboneConfig::SmallCnn(SmallCnnConfig {
                widths: vec![4],
                frozen_bn: frozen,
                ..SmallCnnConfig::default()
            }),
            head: EmbeddingHeadConfig::default(),
        };
        let net = EmbeddingNet::new(&cfg, store.var_builder(DType::F32, &cpu())).unwrap();
        assert_eq!(net.uses_batch_statistics(), !frozen);
        let x = Tensor::randn(0f32, 1.0, (4, 3, 6, 6), &cpu()).unwrap();
        let y = net.forward_t(&x, true).unwrap();
        let rm: Vec<f32> = store
            .get("backbone.stages.0.0.bn.running_mean")
            .unwrap()
            .as_tensor()
            .to_vec1()
            .unwrap();
        assert_eq!(rm.iter().all(|v| *v == 0.0), frozen, "{rm:?}");
        let grads = y.sum_all().unwrap().backward().unwrap();
        let w = store.get("backbone.stages.0.0.bn.weight").unwrap();
        assert!(
            grads.get(w.as_tensor()).is_some(),
            "BN affine parameters get gradients"
        );
        let rv = store.get("backbone.stages.0.0.bn.running_var").unwrap();
        assert!(
            grads.get(rv.as_tensor()).is_none(),
            "running statistics get none"
        );
    }
}

/// Writes `tensors` as a safetensors file.
fn write_safetensors(path: &std::path::Path, tensors: Vec<(String, Tensor)>) {
    let map: HashMap<String, Tensor> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, path).unwrap();
}

#[test]
fn pretrained_weights_load_by_torchvision_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resnet18_tiny.safetensors");
    // A "pretrained" miniature ResNet-18 state dict, as torchvision names it (no prefix), with
    // the classifier and BN counters a converted state dict also holds.
    let mut cfg = ResNetConfig::new(ResNetDepth::Resnet18, true);
    cfg.base_width = 2;
    let source = ParamStore::new(42);
    ResNet::new(&cfg, source.var_builder(DType::F32, &cpu())).unwrap();
    let mut tensors: Vec<(String, Tensor)> = source
        .all()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().copy().unwrap()))
        .collect();
    tensors.push((
        "fc.weight".into(),
        Tensor::zeros((1000, 16), DType::F32, &cpu()).unwrap(),
    ));
    tensors.push((
        "bn1.num_batches_tracked".into(),
        Tensor::new(&[7i64], &cpu()).unwrap().squeeze(0).unwrap(),
    ));
    write_safetensors(&path, tensors.clone());

    let net_cfg = EmbeddingNetConfig {
        backbone: BackboneConfig::Resnet(cfg.clone()),
        head: EmbeddingHeadConfig::default(),
    };
    let target = ParamStore::new(0);
    EmbeddingNet::new(&net_cfg, target.var_builder(DType::F32, &cpu())).unwrap();
    let unused = target.load_safetensors(&path, BACKBONE_PREFIX).unwrap();
    assert_eq!(unused, vec!["bn1.num_batches_tracked", "fc.weight"]);
    for (name, var) in source.all() {
        let a: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = target
            .get(&format!("backbone.{name}"))
            .unwrap()
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(a, b, "{name}");
    }

    // A missing tensor: the error names the file and the tensor.
    let missing = dir.path().join("missing_one.safetensors");
    write_safetensors(
        &missing,
        tensors
            .iter()
            .filter(|(n, _)| n != "layer3.1.bn2.running_var")
            .cloned()
            .collect(),
    );
    let e = target
        .load_safetensors(&missing, BACKBONE_PREFIX)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing_one.safetensors") && e.contains("`layer3.1.bn2.running_var`"),
        "{e}"
    );
    // A wrong shape (a full-width ResNet's stem).
    let wrong = dir.path().join("wrong_shape.safetensors");
    let mut bad = tensors.clone();
    bad.retain(|(n, _)| n != "conv1.weight");
    bad.push((
        "conv1.weight".into(),
        Tensor::zeros((64, 3, 7, 7), DType::F32, &cpu()).unwrap(),
    ));
    write_safetensors(&wrong, bad);
    let e = target
        .load_safetensors(&wrong, BACKBONE_PREFIX)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("wrong_shape.safetensors")
            && e.contains("`conv1.weight` has shape [64, 3, 7, 7]"),
        "{e}"
    );
    // No file, and a file that is not safetensors.
    let nope = dir.path().join("nope.safetensors");
    let e = target
        .load_safetensors(&nope, BACKBONE_PREFIX)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.safetensors"), "{e}");
    std::fs::write(&nope, b"not a safetensors file").unwrap();
    let e = target
        .load_safetensors(&nope, BACKBONE_PREFIX)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nope.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );
    // NaN weights are refused.
    let nan = dir.path().join("nan.safetensors");
    let mut with_nan = tensors;
    with_nan.retain(|(n, _)| n != "bn1.weight");
    with_nan.push((
        "bn1.weight".into(),
        Tensor::new(&[f32::NAN, 1.0], &cpu()).unwrap(),
    ));
    write_safetensors(&nan, with_nan);
    let e = target
        .load_safetensors(&nan, BACKBONE_PREFIX)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`bn1.weight` contains NaN"), "{e}");
}

#[test]
fn pretrained_hub_references_resolve_from_the_cache_without_network() {
    use rankwise::models::pretrained::{resolve_in, HubFile};
    use std::path::Path;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    // The layout of huggingface_hub's cache: refs/<revision> names the snapshot's commit.
    let repo = cache.join("models--org--resnet-tiny");
    let commit = "d3adb33f";
    let snap = repo.join("snapshots").join(commit).join("sub");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), format!("{commit}\n")).unwrap();
    std::fs::write(snap.join("w.safetensors"), b"x").unwrap();
    let want = snap.join("w.safetensors");
    let spec = Path::new("hf:org/resnet-tiny/sub/w.safetensors");
    // Cached: found whether or not the network may be used (it is never tried).
    assert_eq!(resolve_in(spec, &cache, true).unwrap(), want);
    assert_eq!(resolve_in(spec, &cache, false).unwrap(), want);
    // A revision given as the commit itself.
    let by_commit = Path::new("hf:org/resnet-tiny@d3adb33f/sub/w.safetensors");
    assert_eq!(resolve_in(by_commit, &cache, true).unwrap(), want);
    // A local path is itself.
    let local = Path::new("weights/r50.safetensors");
    assert_eq!(resolve_in(local, &cache, true).unwrap(), local);
    // Not cached and offline: an error naming the reference and the cache folder.
    for missing in [
        "hf:org/resnet-tiny/other.safetensors",
        "hf:org/resnet-tiny@v2/sub/w.safetensors",
        "hf:org/absent/w.safetensors",
    ] {
        let e = resolve_in(Path::new(missing), &cache, true)
            .unwrap_err()
            .to_string();
        let f = HubFile::parse(missing.strip_prefix("hf:").unwrap()).unwrap();
        assert!(
            e.contains(&f.repo)
                && e.contains("HF_HUB_OFFLINE")
                && e.contains(&*cache.to_string_lossy()),
            "{e}"
        );
    }
    // Without the `hub` feature, a file that is not cached cannot be fetched: said so at once.
    #[cfg(not(feature = "hub"))]
    {
        let e = resolve_in(Path::new("hf:org/absent/w.safetensors"), &cache, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--features hub"), "{e}");
    }
    let e = resolve_in(Path::new("hf:org-only"), &cache, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("hf:org-only") && e.contains("pretrained"), "{e}");
}

/// The vendored candle-core stores each gradient as computed instead of adding it to a fresh
/// zero tensor (vendor/candle-core/RANKWISE.md). On a graph that reuses tensors (`b + b`, `a`
/// in five places), subtracts, broadcasts, transposes and multiplies matrices, every gradient
/// equals the hand-derived one and is stored contiguous, as upstream's sums were:
/// `L = Σ (a + b)⊙a − Σ (b + b) + Σ a·w + Σ (aᵀ)²` gives `∂L/∂a = 4a + b + w·1`,
/// `∂L/∂b = Σ_i a_i − 2`, `∂L/∂w = aᵀ·1`.
#[test]
fn backward_sums_shared_edges_and_stores_contiguous_gradients() {
    use candle_core::Var;
    let (av, bv, wv) = (
        vec![1.0f64, -2.0, 0.5, 3.0, -1.5, 2.5],
        vec![0.3f64, -0.7, 1.1],
        vec![0.2f64, -0.4, 1.5, 0.6, -0.9, 0.1],
    );
    let a = Var::from_vec(av.clone(), (2, 3), &cpu()).unwrap();
    let b = Var::from_vec(bv.clone(), (1, 3), &cpu()).unwrap();
    let w = Var::from_vec(wv.clone(), (3, 2), &cpu()).unwrap();
    let t1 = (a.broadcast_add(&b).unwrap() * a.as_tensor())
        .unwrap()
        .sum_all()
        .unwrap();
    let t2 = (b.as_tensor() + b.as_tensor()).unwrap().sum_all().unwrap();
    let t3 = a.matmul(&w).unwrap().sum_all().unwrap();
    let t4 = a.t().unwrap().sqr().unwrap().sum_all().unwrap();
    let loss = ((t1 - t2).unwrap() + t3).unwrap() + t4;
    let grads = loss.unwrap().backward().unwrap();
    let got = |v: &Var| {
        let g = grads.get(v).expect("a gradient for every variable");
        assert!(g.is_contiguous(), "stored gradients are contiguous");
        assert_eq!(g.dims(), v.dims());
        g.flatten_all().unwrap().to_vec1::<f64>().unwrap()
    };
    let (ga, gb, gw) = (got(&a), got(&b), got(&w));
    for i in 0..2 {
        for j in 0..3 {
            let want = 4.0 * av[i * 3 + j] + bv[j] + wv[j * 2] + wv[j * 2 + 1];
            assert!((ga[i * 3 + j] - want).abs() < 1e-12, "∂a[{i},{j}]");
        }
    }
    for j in 0..3 {
        let column = av[j] + av[3 + j];
        assert!((gb[j] - (column - 2.0)).abs() < 1e-12, "∂b[{j}]");
        for k in 0..2 {
            assert!((gw[j * 2 + k] - column).abs() < 1e-12, "∂w[{j},{k}]");
        }
    }
}

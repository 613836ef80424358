//! The GPU check of issue 20: every loss, the metrics engine, the models, the optimizers and a
//! checkpoint resume run on the chosen device and are compared with the CPU; then the GPU
//! benchmarks of our side (losses up to the largest batch that fits, SOP-scale evaluation,
//! training throughput). `scripts/gpu_check.sh` runs it on the GPU machine together with the
//! PyTorch anchors and writes everything into one output folder.
//!
//! ```text
//! gpu_check --device cuda --out OUT [--budget-s 300] [--only correctness,losses,eval,train,pipeline]
//!           [--families smooth_rank,rambo] [--models small_cnn,resnet18,resnet50] [--cap 16384]
//!           [--losses happier,smooth-ap,roadmap,triplet-semihard,fastap,rambo,contrastive]
//!           [--start-batch 256]
//! cargo run --release --example gpu_check -- --device cpu --out target/gpu_check --small
//! ```
//!
//! The report, `OUT/gpu_check.json`, is rewritten atomically after every item, so a run cut
//! short by its time budget (or killed) still leaves every finished check. Each check has a
//! `status`: `pass` (within its tolerance), `fail` (outside it: the numbers are in the entry) or
//! `error` (it did not run: the message says why). `correctness` is the five parts `threads`,
//! `metrics`, `models`, `resume` and `loss-checks`, which `--only` also takes one by one; `--families`
//! keeps the loss checks of the given families (the device kernels they run through:
//! `smooth_rank`, `triplet`, `rambo`, `fastap`, and `other`), so that a script can run each
//! family in a process of its own: a kernel that faults leaves its CUDA context unusable for the
//! rest of its process. With `--device cpu` the "device" side is the
//! CPU too, which tests this program without a GPU (CI builds it; `--small` runs it in seconds).
//!
//! Tolerances (relative to the CPU reference's largest magnitude): `f32` 1e-4, `f64` 1e-9. The
//! CPU reference and the device compute the same formulas, but their matrix products add in a
//! different order; rank-based losses can then see a near-tie swap (RaMBO's exact ranks, the
//! triplet miner's semi-hard window), which the entry reports as such rather than hiding it.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rankwise::losses::cluster::ClusterLoss;
use rankwise::losses::contrastive::{Contrastive, PairReduction};
use rankwise::losses::csl::{Csl, CslConfig};
use rankwise::losses::fastap::{FastAp, FastApGradient};
use rankwise::losses::happier::{HapLoss, Happier};
use rankwise::losses::happier::{HappierConfig, RelevanceKind};
use rankwise::losses::norm_softmax::{NormSoftmax, NormSoftmaxConfig};
use rankwise::losses::proxy_nca::{ProxyNca, ProxyNcaConfig};
use rankwise::losses::proxy_nca_pp::{ProxyNcaPp, ProxyNcaPpConfig};
use rankwise::losses::rambo::{Rambo, RamboWithMemory, RecallWeight};
use rankwise::losses::rambo::{RamboConfig, RamboMetric};
use rankwise::losses::roadmap::Roadmap;
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::losses::summed_levels::SummedConfig;
use rankwise::losses::triplet::{Triplet, TripletMining};
use rankwise::losses::{guard, RankLoss};
use rankwise::losses::{LossConfig, LossContext};
use rankwise::models::{
    BackboneConfig, EmbeddingHeadConfig, EmbeddingNet, EmbeddingNetConfig, ParamStore,
    ResNetConfig, ResNetDepth, SmallCnnConfig, BACKBONE_PREFIX, HEAD_PREFIX,
};
use rankwise::retrieval::{self, EvalOptions, SelfMatch, Similarity};
use rankwise::train::large_batch::direct_gradients;
use rankwise::train::{
    AdamConfig, Algorithm, DeviceChoice, Optimizer, OutputConfig, ParamGroup, SgdConfig,
    TrainConfig, Trainer,
};
use rankwise::Labels;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Args {
    device: String,
    out: PathBuf,
    budget_s: f64,
    only: Vec<String>,
    small: bool,
    cap: usize,
    models: Vec<String>,
    losses: Vec<String>,
    families: Vec<String>,
    start_batch: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        device: "cuda".into(),
        out: PathBuf::from("target/gpu_check"),
        budget_s: 300.0,
        only: Vec::new(),
        small: false,
        cap: 16_384,
        // The two models with targets first: the budget may stop the last.
        models: vec!["small_cnn".into(), "resnet50".into(), "resnet18".into()],
        losses: Vec::new(),
        families: Vec::new(),
        start_batch: 256,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--device" => args.device = value()?,
            "--out" => args.out = value()?.into(),
            "--budget-s" => args.budget_s = value()?.parse().context("--budget-s")?,
            "--only" => args.only = value()?.split(',').map(str::to_owned).collect(),
            "--cap" => args.cap = value()?.parse().context("--cap")?,
            "--models" => args.models = value()?.split(',').map(str::to_owned).collect(),
            "--losses" => args.losses = value()?.split(',').map(str::to_owned).collect(),
            "--families" => {
                args.families = value()?.split(',').map(str::to_owned).collect();
                if let Some(f) = args
                    .families
                    .iter()
                    .find(|f| !FAMILIES.contains(&f.as_str()))
                {
                    bail!("--families: unknown family {f} (one of {FAMILIES:?})");
                }
            }
            "--start-batch" => args.start_batch = value()?.parse().context("--start-batch")?,
            "--small" => args.small = true,
            "-h" | "--help" => {
                println!(
                    "gpu_check [--device cuda|cpu] [--out DIR] [--budget-s S] [--cap B] \
                     [--only correctness,losses,eval,train,pipeline] [--families smooth_rank,...] \
                     [--models small_cnn,resnet18,resnet50] [--losses happier,...] \
                     [--start-batch B] [--small]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    Ok(args)
}

/// The report, written atomically after every entry.
struct Report {
    path: PathBuf,
    doc: Value,
    start: Instant,
    budget_s: f64,
}

impl Report {
    fn new(out: &Path, device: &str, budget_s: f64) -> Result<Self> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join("gpu_check.json");
        // Several invocations (one per section, each under its own `timeout`) share one report:
        // a later one appends to what the earlier ones wrote.
        if let Ok(text) = std::fs::read_to_string(&path) {
            let doc: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a gpu_check report", path.display()))?;
            return Ok(Report {
                path,
                doc,
                start: Instant::now(),
                budget_s,
            });
        }
        let doc = json!({
            "device": device,
            "build": { "cuda_feature": cfg!(feature = "cuda"), "cudnn_feature": cfg!(feature = "cudnn"),
                       "version": env!("CARGO_PKG_VERSION") },
            "rayon_threads": rayon::current_num_threads(),
            "checks": [],
            "benchmarks": [],
        });
        Ok(Report {
            path,
            doc,
            start: Instant::now(),
            budget_s,
        })
    }

    fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn over_budget(&self) -> bool {
        self.elapsed() > self.budget_s
    }

    fn push(&mut self, list: &str, mut entry: Value) -> Result<()> {
        entry["backend"] = backend();
        entry["t_end_s"] = json!(round(self.elapsed(), 3));
        entry["unix_end_ms"] = json!(unix_ms());
        eprintln!("[gpu_check] {entry}");
        self.doc[list]
            .as_array_mut()
            .expect("lists are arrays")
            .push(entry);
        self.save()
    }

    fn save(&self) -> Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.doc)?)?;
        std::fs::rename(&tmp, &self.path)?;
        Ok(())
    }
}

/// Which kernels an entry ran through: the models' cuDNN path (feature `cudnn`, switched off by
/// `RANKWISE_CUDNN=0`), the smooth-rank losses' device kernels (switched off by
/// `RANKWISE_DEVICE_KERNELS=0`; they apply only on CUDA, up to their size bound) and whether
/// TF32 was forbidden (`NVIDIA_TF32_OVERRIDE=0`), and whether the device's memory pool keeps
/// its freed memory (`RANKWISE_POOL_RETAIN=0`: CUDA's default, released at every sync).
fn backend() -> Value {
    #[cfg(feature = "cudnn")]
    let cudnn = rankwise::models::cudnn::enabled();
    #[cfg(not(feature = "cudnn"))]
    let cudnn = false;
    json!({"cudnn": cudnn,
           "device_kernels": rankwise::kernels::enabled(),
           "kernel_max_work": rankwise::kernels::max_work(),
           "pinned_copies": rankwise::retrieval::pinned::enabled(),
           "pinned_uploads": rankwise::data::staging::enabled(),
           "device_ranking": rankwise::retrieval::device_rank::enabled(),
           "pool_retention": rankwise::device::pool_retention(),
           "nvidia_tf32_override": std::env::var("NVIDIA_TF32_OVERRIDE").ok()})
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        1e-9
    } else {
        1e-4
    }
}

/// `max |a − b| / max(max |b|, tiny)`: the error relative to the reference's scale, so that
/// entries near zero in a large gradient do not dominate.
fn rel_error(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn host(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?)
}

fn normal(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| StandardNormal.sample(&mut rng)).collect()
}

/// The suffix of a loss check's name that labels its batch with [`four_classes`].
const FOUR_CLASSES: &str = "four_classes";

/// One level: 4 classes of `b / 4` images, as `batch_labels`' fine classes are spread.
fn four_classes(b: usize) -> Result<Labels> {
    Ok(Labels::from_fine(
        &(0..b as i64).map(|i| (i / 4) % 4).collect::<Vec<_>>(),
    )?)
}

/// Two levels: 4 images per fine class, fine classes spread over `coarse` super-classes.
fn batch_labels(b: usize, coarse: i64) -> Result<Labels> {
    Ok(Labels::new(
        (0..b as i64)
            .map(|i| {
                let fine = i / 4;
                vec![fine, 1_000_000 + fine % coarse]
            })
            .collect(),
    )?)
}

fn embeddings(data: &[f64], b: usize, d: usize, dtype: DType, dev: &Device) -> Result<Var> {
    let t = Tensor::from_vec(data.to_vec(), (b, d), &Device::Cpu)?.to_dtype(dtype)?;
    Ok(Var::from_tensor(&t.to_device(dev)?)?)
}

/// Every loss and every option that takes another code path.
fn loss_variants() -> Vec<(String, LossConfig)> {
    let mut v: Vec<(String, LossConfig)> = vec![
        (
            "smooth_ap".into(),
            LossConfig::SmoothAp(SmoothAp::default()),
        ),
        (
            "smooth_ap include_self".into(),
            LossConfig::SmoothAp(SmoothAp {
                include_self: true,
                ..SmoothAp::default()
            }),
        ),
        ("fastap".into(), LossConfig::FastAp(FastAp::default())),
        (
            "fastap authors_gradient bins=20".into(),
            LossConfig::FastAp(FastAp {
                num_bins: 20,
                gradient: FastApGradient::AuthorsPort,
                ..FastAp::default()
            }),
        ),
    ];
    for (metric, name) in [
        (RamboMetric::Ap, "ap"),
        (RamboMetric::RecallLog, "recall_log"),
        (RamboMetric::RecallLogLog, "recall_log_log"),
    ] {
        v.push((
            format!("rambo {name}"),
            LossConfig::Rambo(RamboConfig {
                metric,
                ..RamboConfig::default()
            }),
        ));
    }
    v.push((
        "rambo recall_log_log margin=0".into(),
        LossConfig::Rambo(RamboConfig {
            margin: 0.0,
            ..RamboConfig::default()
        }),
    ));
    v.push((
        "rambo ap half_normal_margin".into(),
        LossConfig::Rambo(RamboConfig {
            metric: RamboMetric::Ap,
            half_normal_margin: true,
            ..RamboConfig::default()
        }),
    ));
    // Four classes of B/4: relevant groups that the backward pass sorts in several merges.
    v.push((
        format!("rambo ap {FOUR_CLASSES}"),
        LossConfig::Rambo(RamboConfig {
            metric: RamboMetric::Ap,
            ..RamboConfig::default()
        }),
    ));
    v.push((
        "rambo recall_log_log memory=3".into(),
        LossConfig::Rambo(RamboConfig {
            memory: 3,
            ..RamboConfig::default()
        }),
    ));
    v.push((
        "happier".into(),
        LossConfig::Happier(HappierConfig::default()),
    ));
    v.push((
        "happier lambda=0 (H-AP alone)".into(),
        LossConfig::Happier(HappierConfig {
            lambda: 0.0,
            ..HappierConfig::default()
        }),
    ));
    v.push((
        "happier weighted_ap alpha=5 no_hrank include_self".into(),
        LossConfig::Happier(HappierConfig {
            alpha: 5.0,
            relevance: RelevanceKind::WeightedAp,
            with_hrank: false,
            include_self: true,
            ..HappierConfig::default()
        }),
    ));
    v.push(("roadmap".into(), LossConfig::Roadmap(Roadmap::default())));
    v.push((
        "supap (roadmap calibration=0)".into(),
        LossConfig::Roadmap(Roadmap {
            calibration_weight: 0.0,
            ..Roadmap::default()
        }),
    ));
    v.push((
        "contrastive".into(),
        LossConfig::Contrastive(Contrastive::default()),
    ));
    // The device kernels' other metric and reduction (pml's default: normalised Euclidean
    // distance, margins 0 and 1; the mean over all pairs of a kind).
    v.push((
        "contrastive euclidean (pml default)".into(),
        LossConfig::Contrastive(Contrastive::pml_default()),
    ));
    v.push((
        "contrastive mean over all pairs".into(),
        LossConfig::Contrastive(Contrastive {
            reduction: PairReduction::Mean,
            ..Contrastive::default()
        }),
    ));
    for (mining, name) in [
        (
            TripletMining::EasyPositiveSemiHardNegative,
            "easy_pos_semi_hard_neg",
        ),
        (TripletMining::SemiHard, "semi_hard"),
        (TripletMining::All, "all"),
    ] {
        v.push((
            format!("triplet {name}"),
            LossConfig::Triplet(Triplet {
                mining,
                ..Triplet::default()
            }),
        ));
    }
    v.push((
        "norm_softmax".into(),
        LossConfig::NormSoftmax(NormSoftmaxConfig::default()),
    ));
    // ArcFace: the margin's logits go to the device cross-entropy at scale 1.
    v.push((
        "norm_softmax arcface margin=0.5".into(),
        LossConfig::NormSoftmax(NormSoftmaxConfig {
            margin: 0.5,
            ..NormSoftmaxConfig::default()
        }),
    ));
    // ProxyNCA++: NSM's device cross-entropy at T/2, its own Gaussian proxies.
    v.push((
        "proxy_nca_pp".into(),
        LossConfig::ProxyNcaPp(ProxyNcaPpConfig::default()),
    ));
    // ProxyNCA: candle ops end to end, the positive's mask built on the device.
    v.push((
        "proxy_nca".into(),
        LossConfig::ProxyNca(ProxyNcaConfig::default()),
    ));
    v.push(("csl".into(), LossConfig::Csl(CslConfig::default())));
    v.push((
        "summed(triplet)".into(),
        LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::Triplet(Triplet::default())),
            levels: None,
        }),
    ));
    v.push((
        "summed(norm_softmax)".into(),
        LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::NormSoftmax(NormSoftmaxConfig::default())),
            levels: None,
        }),
    ));
    v
}

/// Losses with learnable f32 class proxies (HAPPIER's clustering term, the normalised softmax,
/// ProxyNCA++, ProxyNCA, CSL).
fn has_proxies(config: &LossConfig) -> bool {
    match config {
        LossConfig::Happier(c) => c.lambda > 0.0,
        LossConfig::NormSoftmax(_)
        | LossConfig::ProxyNcaPp(_)
        | LossConfig::ProxyNca(_)
        | LossConfig::Csl(_) => true,
        LossConfig::Summed(s) => has_proxies(&s.base),
        _ => false,
    }
}

/// Losses whose gradient depends on discrete decisions taken on the similarities.
fn is_discrete(config: &LossConfig) -> bool {
    match config {
        LossConfig::Rambo(_) | LossConfig::Triplet(_) => true,
        LossConfig::Summed(s) => is_discrete(&s.base),
        _ => false,
    }
}

/// [`tolerance`], except in `f64` with f32 proxies, whose rounding (≈ 6e-8 relative) is
/// amplified by the softmax temperature (1/0.05).
fn loss_tolerance(dtype: DType, f32_proxies: bool) -> f64 {
    if dtype == DType::F64 && f32_proxies {
        1e-6
    } else {
        tolerance(dtype)
    }
}

/// Rows of the `b × d` gradient whose largest difference exceeds `tol` × the reference's scale.
fn differing_rows(a: &[f64], b: &[f64], d: usize, tol: f64) -> usize {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.chunks(d)
        .zip(b.chunks(d))
        .filter(|(x, y)| x.iter().zip(*y).any(|(p, q)| (p - q).abs() > tol * scale))
        .count()
}

/// One loss comparison: the batch (`b × d`, row-major) and its labels, and the batches fed
/// before it to a loss with state.
struct LossCase<'a> {
    labels: &'a Labels,
    data: &'a [f64],
    warmup: &'a [Vec<f64>],
    b: usize,
    d: usize,
    dtype: DType,
}

/// Value and input gradient of one loss on one device; a loss with state (RaMBO's memory) is
/// first fed `warmup` batches so that the compared step uses its memory.
fn loss_run(config: &LossConfig, case: &LossCase, dev: &Device) -> Result<(f64, Vec<f64>)> {
    let LossCase {
        labels,
        data,
        warmup,
        b,
        d,
        dtype,
    } = *case;
    let ctx = LossContext {
        train_labels: labels,
        dim: d,
        seed: 7,
        device: dev,
    };
    // Proxies (HAPPIER's clustering term, the normalised softmax) are f32 on either device and
    // cast to the embeddings' dtype inside the loss.
    let loss = config.build(&ctx)?;
    for w in warmup {
        let e = embeddings(w, b, d, dtype, dev)?;
        loss.forward(e.as_tensor(), labels)?;
    }
    let e = embeddings(data, b, d, dtype, dev)?;
    // As a training step runs it: on the device, the input checks' verdicts are added to the
    // value (`guard::deferred`), which must then still equal the CPU's.
    let value = guard::deferred(|| loss.forward(e.as_tensor(), labels))?;
    let grads = value.backward()?;
    let g = grads.get(&e).context("no gradient for the embeddings")?;
    Ok((host(&value)?[0], host(g)?))
}

/// A batch with one bad row (row 5 set to `bad`) through a fresh loss: the error of the
/// checks made at once (the CPU's), or, with `deferred` (the device, as a training step runs
/// it), either that error or a value that is not finite, which `guard::explain` turns into
/// the error. `Ok(value)`: no error and a finite value (a loss that does not normalise, given
/// a zero row).
fn guard_run(
    config: &LossConfig,
    case: &LossCase,
    bad: f64,
    dev: &Device,
    deferred: bool,
) -> Result<std::result::Result<f64, String>> {
    let ctx = LossContext {
        train_labels: case.labels,
        dim: case.d,
        seed: 7,
        device: dev,
    };
    let loss = config.build(&ctx)?;
    let mut data = case.data.to_vec();
    data[5 * case.d..6 * case.d].fill(bad);
    let e = embeddings(&data, case.b, case.d, case.dtype, dev)?;
    let value = if deferred {
        guard::deferred(|| loss.forward(e.as_tensor(), case.labels))
    } else {
        loss.forward(e.as_tensor(), case.labels)
    };
    Ok(match value {
        Err(err) => Err(err.to_string()),
        Ok(v) => {
            let v = host(&v)?[0];
            match guard::explain(loss.as_ref(), e.as_tensor(), case.labels) {
                Err(err) if !v.is_finite() => Err(err.to_string()),
                _ => Ok(v),
            }
        }
    })
}

/// The families of [`loss_variants`]: the device kernels each goes through (`other`: none of
/// its own).
const FAMILIES: [&str; 5] = ["smooth_rank", "triplet", "rambo", "fastap", "other"];

/// The family of the loss variant `name`.
fn family(name: &str) -> &'static str {
    match name.split(' ').next().unwrap_or("") {
        "smooth_ap" | "happier" | "roadmap" | "supap" => "smooth_rank",
        "triplet" | "summed(triplet)" => "triplet",
        "rambo" => "rambo",
        "fastap" => "fastap",
        _ => "other",
    }
}

/// The loss checks: every variant (or those of `families`), f32 and f64, B = 64 and 1024, on
/// the device against the CPU.
fn check_losses(report: &mut Report, dev: &Device, small: bool, families: &[String]) -> Result<()> {
    let d = 128;
    let batches: &[usize] = if small { &[64] } else { &[64, 1024] };
    for &b in batches {
        let labels = batch_labels(b, 4)?;
        let large_classes = four_classes(b)?;
        let data = normal(b * d, b as u64);
        let warmup = vec![
            normal(b * d, 1000 + b as u64),
            normal(b * d, 2000 + b as u64),
        ];
        for dtype in [DType::F32, DType::F64] {
            let variants = loss_variants().into_iter().filter(|(name, _)| {
                families.is_empty() || families.iter().any(|f| f == family(name))
            });
            for (name, config) in variants {
                if report.over_budget() {
                    return Ok(());
                }
                let start = Instant::now();
                let warm: &[Vec<f64>] = if matches!(&config, LossConfig::Rambo(c) if c.memory > 0) {
                    &warmup
                } else {
                    &[]
                };
                let case = LossCase {
                    labels: if name.ends_with(FOUR_CLASSES) {
                        &large_classes
                    } else {
                        &labels
                    },
                    data: &data,
                    warmup: warm,
                    b,
                    d,
                    dtype,
                };
                let cpu = loss_run(&config, &case, &Device::Cpu);
                let gpu = loss_run(&config, &case, dev);
                let entry = match (cpu, gpu) {
                    (Ok((vc, gc)), Ok((vg, gg))) => {
                        let ev = rel_error(&[vg], &[vc]);
                        let eg = rel_error(&gg, &gc);
                        let proxies = has_proxies(&config);
                        let tol = loss_tolerance(dtype, proxies);
                        let rows = differing_rows(&gg, &gc, d, tol);
                        let mut status = if ev <= tol && eg <= tol {
                            "pass"
                        } else {
                            "fail"
                        };
                        let mut reason = if proxies && dtype == DType::F64 {
                            "the class proxies are f32 parameters: their normalisation rounds                              in f32 on each device before the f64 loss"
                        } else {
                            ""
                        };
                        // A loss that takes discrete decisions on the similarities (exact ranks,
                        // a mining window) flips a near-tie when the f32 products of the two
                        // devices round differently: a few rows then get another gradient.
                        if status == "fail"
                            && is_discrete(&config)
                            && dtype == DType::F32
                            && ev <= tol
                            && rows * 100 <= b
                        {
                            status = "pass";
                            reason = "near-tie: f32 similarities round differently on the two                                       devices and a discrete decision (rank or mining window)                                       flips for a few rows (at most 1% allowed; the f64 check                                       of the same loss is exact)";
                        }
                        json!({
                            "kind": "loss", "name": name, "family": family(&name),
                            "B": b, "D": d,
                            "dtype": format!("{dtype:?}"), "status": status,
                            "value_cpu": vc, "value_device": vg,
                            "value_rel_err": ev, "grad_rel_err": eg, "tolerance": tol,
                            "grad_rows_outside_tolerance": rows, "reason": reason,
                            "seconds": round(start.elapsed().as_secs_f64(), 3),
                        })
                    }
                    (cpu, gpu) => json!({
                        "kind": "loss", "name": name, "family": family(&name), "B": b,
                        "dtype": format!("{dtype:?}"),
                        "status": "error",
                        "error": format!("cpu: {:?}; device: {:?}",
                            cpu.err().map(|e| e.to_string()), gpu.err().map(|e| e.to_string())),
                    }),
                };
                report.push("checks", entry)?;
                // A NaN row and a zero row: the device's deferred checks (a NaN value, then
                // the host's check of `explain`) end in the CPU's error, naming the row.
                if b == batches[0] && dtype == DType::F32 {
                    for bad in [f64::NAN, 0.0] {
                        let start = Instant::now();
                        let cpu = guard_run(&config, &case, bad, &Device::Cpu, false);
                        let gpu = guard_run(&config, &case, bad, dev, true);
                        let entry = match (cpu, gpu) {
                            (Ok(cpu), Ok(gpu)) => {
                                let same = match (&cpu, &gpu) {
                                    (Err(a), Err(b)) => a == b,
                                    // No error on either: a zero row where nothing normalises.
                                    (Ok(a), Ok(b)) => a.is_finite() && b.is_finite() && bad == 0.0,
                                    _ => false,
                                };
                                json!({
                                    "kind": "loss-guard", "name": name, "family": family(&name),
                                    "B": b, "bad_row": format!("{bad}"),
                                    "status": if same { "pass" } else { "fail" },
                                    "cpu": format!("{cpu:?}"), "device": format!("{gpu:?}"),
                                    "seconds": round(start.elapsed().as_secs_f64(), 3),
                                })
                            }
                            (cpu, gpu) => json!({
                                "kind": "loss-guard", "name": name, "family": family(&name),
                                "B": b, "bad_row": format!("{bad}"), "status": "error",
                                "error": format!("cpu: {:?}; device: {:?}",
                                    cpu.err().map(|e| e.to_string()),
                                    gpu.err().map(|e| e.to_string())),
                            }),
                        };
                        report.push("checks", entry)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// A way of computing values on the device and reading them back to the host.
type ReadBack<'a> = Box<dyn Fn() -> Result<Vec<f32>> + 'a>;

/// `y ← y a / √n`, 8 times: a chain of matrix products that keeps the device busy for a while.
fn product_chain(a: &Tensor) -> Result<Tensor> {
    let scale = 1.0 / (a.dim(0)? as f64).sqrt();
    let mut y = a.clone();
    for _ in 0..8 {
        y = (y.matmul(a)? * scale)?;
    }
    Ok(y)
}

/// Work queued by one thread and read by another with no synchronisation between them, as the
/// loader's uploads (`data::staging`) and the evaluation's chunks (`retrieval`) do: the device
/// is opened on one stream that every thread queues on (`rankwise::device`), so the reader
/// must see the finished values. Three ways: a worker's products read by this thread, this
/// thread's products read by a worker, and a worker's upload of 64 MB read here; each against
/// the same values computed with a synchronisation (bit for bit: the same kernels).
fn check_threads(report: &mut Report, dev: &Device) -> Result<()> {
    let n = 1024;
    let host: Vec<f32> = normal(n * n, 41).into_iter().map(|v| v as f32).collect();
    let a = Tensor::from_vec(host, (n, n), &Device::Cpu)?.to_device(dev)?;
    let reference = {
        let y = product_chain(&a)?;
        dev.synchronize()?;
        y.flatten_all()?.to_vec1::<f32>()?
    };
    let big: Vec<f32> = (0..16 << 20).map(|i| (i % 8191) as f32).collect();
    let cases: [(&str, ReadBack<'_>, &[f32]); 3] = [
        (
            "products queued by a worker, read here",
            Box::new(|| {
                let y = std::thread::scope(|s| s.spawn(|| product_chain(&a)).join())
                    .map_err(|_| anyhow::anyhow!("the worker panicked"))??;
                Ok(y.flatten_all()?.to_vec1::<f32>()?)
            }),
            &reference,
        ),
        (
            "products queued here, read by a worker",
            Box::new(|| {
                let y = product_chain(&a)?;
                std::thread::scope(|s| s.spawn(|| y.flatten_all()?.to_vec1::<f32>()).join())
                    .map_err(|_| anyhow::anyhow!("the worker panicked"))?
                    .map_err(Into::into)
            }),
            &reference,
        ),
        (
            "64 MB uploaded by a worker, read here",
            Box::new(|| {
                let t = std::thread::scope(|s| {
                    s.spawn(|| Tensor::from_slice(&big[..], big.len(), dev))
                        .join()
                })
                .map_err(|_| anyhow::anyhow!("the worker panicked"))??;
                Ok(t.to_vec1::<f32>()?)
            }),
            &big,
        ),
    ];
    // The library hands work across threads only on a device whose threads share a stream:
    // this one (opened by `rankwise::device::open_cuda`) must say so, and one that candle's
    // `new_cuda` opened on per-thread streams must not.
    if dev.is_cuda() {
        let ours = rankwise::device::shared_stream(dev);
        let candles = rankwise::device::shared_stream(&Device::new_cuda(0)?);
        report.push(
            "checks",
            json!({"kind": "threads", "name": "one stream recognised: open_cuda's yes, new_cuda's no",
                "status": if ours && !candles { "pass" } else { "fail" },
                "open_cuda_shared": ours, "new_cuda_shared": candles}),
        )?;
    }
    for (name, run, want) in cases {
        let start = Instant::now();
        let entry = match run() {
            Ok(got) => {
                let differing = got
                    .iter()
                    .zip(want)
                    .filter(|(g, w)| g.to_bits() != w.to_bits())
                    .count()
                    + got.len().abs_diff(want.len());
                json!({
                    "kind": "threads", "name": name,
                    "status": if differing == 0 { "pass" } else { "fail" },
                    "values": want.len(), "differing_values": differing,
                    "seconds": round(start.elapsed().as_secs_f64(), 3),
                })
            }
            Err(e) => json!({"kind": "threads", "name": name, "status": "error",
                "error": format!("{e:#}")}),
        };
        report.push("checks", entry)?;
    }
    Ok(())
}

fn check_metrics(report: &mut Report, dev: &Device, small: bool) -> Result<()> {
    let (n, d) = if small { (600, 32) } else { (6000, 128) };
    let data = normal(n * d, 11);
    let x = Tensor::from_vec(data, (n, d), &Device::Cpu)?.to_dtype(DType::F32)?;
    let labels = Labels::new(
        (0..n as i64)
            .map(|i| vec![i / 5, 1_000_000 + i / 40, 2_000_000 + i / 400])
            .collect(),
    )?;
    let options = |device: &Device| EvalOptions {
        recall_ks: vec![1, 10, 100],
        device: device.clone(),
        ..EvalOptions::default()
    };
    let start = Instant::now();
    let entry = match (
        retrieval::evaluate(&x, &labels, None, &options(&Device::Cpu)),
        retrieval::evaluate(&x, &labels, None, &options(dev)),
    ) {
        (Ok(c), Ok(g)) => {
            let vc: Vec<f64> = c.rows.iter().map(|r| r.value).collect();
            let vg: Vec<f64> = g.rows.iter().map(|r| r.value).collect();
            let err = rel_error(&vg, &vc);
            let names: Vec<String> = c
                .rows
                .iter()
                .map(|r| format!("{}@{:?}", r.metric, r.level))
                .collect();
            json!({
                "kind": "metrics", "name": "retrieval::evaluate (every metric, 3 levels)",
                "N": n, "D": d,
                "status": if err <= 1e-4 && vc.len() == vg.len() { "pass" } else { "fail" },
                "rel_err": err, "tolerance": 1e-4, "metrics": names, "cpu": vc, "device": vg,
                "seconds": round(start.elapsed().as_secs_f64(), 3),
            })
        }
        (c, g) => json!({"kind": "metrics", "name": "retrieval::evaluate", "status": "error",
            "error": format!("cpu: {:?}; device: {:?}", c.err().map(|e| e.to_string()),
                g.err().map(|e| e.to_string()))}),
    };
    report.push("checks", entry)?;

    // The device's ranking (retrieval::device_rank) against the host's on the same device
    // scores: the positions are those of the same full sort, so every per-query value must be
    // equal bit for bit. Every metric at 3 levels (all positives), the fine-level binary metrics
    // alone (the fine positives only), and a separate query set with DropFirst and None.
    let queries = x.narrow(0, 0, n / 10)?;
    let query_labels = Labels::new((0..n / 10).map(|i| labels.row(i).to_vec()).collect())?;
    for (case, hierarchical, per_level, self_match) in [
        ("every metric, 3 levels", true, true, SelfMatch::SameIndex),
        (
            "fine-level binary metrics",
            false,
            false,
            SelfMatch::SameIndex,
        ),
        (
            "every metric, separate queries, DropFirst",
            true,
            true,
            SelfMatch::DropFirst,
        ),
        (
            "fine-level binary metrics, separate queries",
            false,
            false,
            SelfMatch::None,
        ),
    ] {
        let opts = EvalOptions {
            hierarchical,
            per_level,
            self_match,
            ..options(dev)
        };
        let separate = self_match != SelfMatch::SameIndex;
        let run = |on: bool| {
            retrieval::device_rank::set_enabled(on);
            let r = if separate {
                retrieval::evaluate(&queries, &query_labels, Some((&x, &labels)), &opts)
            } else {
                retrieval::evaluate(&x, &labels, None, &opts)
            };
            retrieval::device_rank::set_enabled(true);
            r
        };
        let start = Instant::now();
        let entry = match (run(false), run(true)) {
            (Ok(h), Ok(g)) => {
                let same =
                    |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                let differing = h
                    .per_query
                    .iter()
                    .zip(&g.per_query)
                    .filter(|(a, b)| !same(**a, **b))
                    .count();
                let exact = differing == 0 && h.per_query.len() == g.per_query.len();
                json!({
                    "kind": "metrics", "name": format!("device ranking = host ranking ({case})"),
                    "N": n, "D": d, "status": if exact { "pass" } else { "fail" },
                    "exact": exact, "differing_values": differing,
                    "values": g.per_query.len(),
                    "host": h.rows.iter().map(|r| r.value).collect::<Vec<_>>(),
                    "device": g.rows.iter().map(|r| r.value).collect::<Vec<_>>(),
                    "seconds": round(start.elapsed().as_secs_f64(), 3),
                })
            }
            (h, g) => json!({"kind": "metrics", "name": format!("device ranking ({case})"),
                "status": "error",
                "error": format!("host ranking: {:?}; device ranking: {:?}",
                    h.err().map(|e| e.to_string()), g.err().map(|e| e.to_string()))}),
        };
        report.push("checks", entry)?;
    }

    // The device's kNN candidates (retrieval::device_rank) against the host's selection on
    // the same device scores: equal indices and scores. Rows of 20,000 references, long enough
    // for the sampled threshold (the device path's condition); k = 1000 with DropFirst too.
    let big = if small { 16_384 } else { 20_000 };
    let xb =
        Tensor::from_vec(normal(big * 64, 12), (big, 64), &Device::Cpu)?.to_dtype(DType::F32)?;
    for (k, self_match) in [
        (50, SelfMatch::SameIndex),
        (1000, SelfMatch::SameIndex),
        (1000, SelfMatch::DropFirst),
        (20, SelfMatch::None),
    ] {
        let run = |on: bool| {
            retrieval::device_rank::set_enabled(on);
            let q = xb.narrow(0, 0, big / 4)?;
            let queries = if self_match == SelfMatch::SameIndex {
                &xb
            } else {
                &q
            };
            let r = retrieval::knn_with(
                queries,
                &xb,
                k,
                self_match,
                128,
                Similarity::Cosine,
                dev,
                false,
            );
            retrieval::device_rank::set_enabled(true);
            r.map_err(anyhow::Error::from)
        };
        let start = Instant::now();
        let entry = match (run(false), run(true)) {
            (Ok(h), Ok(g)) => {
                let same_indices = h.indices == g.indices;
                let same_scores = h.scores == g.scores;
                json!({
                    "kind": "metrics", "name": format!("device kNN = host kNN (top-{k}, {self_match:?})"),
                    "N": big, "D": 64,
                    "status": if same_indices && same_scores { "pass" } else { "fail" },
                    "exact": same_indices && same_scores,
                    "differing_indices": h.indices.iter().zip(&g.indices).filter(|(a, b)| a != b).count(),
                    "differing_scores": h.scores.iter().zip(&g.scores).filter(|(a, b)| a != b).count(),
                    "seconds": round(start.elapsed().as_secs_f64(), 3),
                })
            }
            (h, g) => {
                json!({"kind": "metrics", "name": format!("device kNN (top-{k}, {self_match:?})"),
                "status": "error",
                "error": format!("host: {:?}; device: {:?}", h.err().map(|e| e.to_string()),
                    g.err().map(|e| e.to_string()))})
            }
        };
        report.push("checks", entry)?;
    }

    let k = 50;
    let run = |device: &Device| {
        retrieval::knn_with(
            &x,
            &x,
            k,
            SelfMatch::SameIndex,
            128,
            Similarity::Cosine,
            device,
            false,
        )
    };
    let entry = match (run(&Device::Cpu), run(dev)) {
        (Ok(c), Ok(g)) => {
            let (mut same, mut total, mut score_err) = (0usize, 0usize, 0f64);
            for i in 0..c.num_queries() {
                let (a, b) = (c.neighbours(i), g.neighbours(i));
                total += a.len();
                same += a.iter().zip(b).filter(|(p, q)| p == q).count();
                for (p, q) in c.row_scores(i).iter().zip(g.row_scores(i)) {
                    score_err = score_err.max((p - q).abs() as f64);
                }
            }
            // A neighbour may differ only where two scores tie to within rounding.
            let agree = same as f64 / total as f64;
            json!({
                "kind": "metrics", "name": "knn top-50", "N": n, "D": d,
                "status": if score_err <= 1e-5 && agree >= 0.999 { "pass" } else { "fail" },
                "same_neighbour_fraction": agree, "max_score_abs_err": score_err,
            })
        }
        (c, g) => json!({"kind": "metrics", "name": "knn", "status": "error",
            "error": format!("cpu: {:?}; device: {:?}", c.err().map(|e| e.to_string()),
                g.err().map(|e| e.to_string()))}),
    };
    report.push("checks", entry)
}

fn model_config(name: &str, frozen_bn: bool) -> Result<EmbeddingNetConfig> {
    let backbone = match name {
        "small_cnn" => BackboneConfig::SmallCnn(SmallCnnConfig {
            frozen_bn,
            ..SmallCnnConfig::default()
        }),
        "resnet18" => BackboneConfig::Resnet(ResNetConfig::new(ResNetDepth::Resnet18, frozen_bn)),
        "resnet34" => BackboneConfig::Resnet(ResNetConfig::new(ResNetDepth::Resnet34, frozen_bn)),
        "resnet50" => BackboneConfig::Resnet(ResNetConfig::new(ResNetDepth::Resnet50, frozen_bn)),
        other => bail!("unknown model {other}"),
    };
    Ok(EmbeddingNetConfig {
        backbone,
        head: EmbeddingHeadConfig::default(),
    })
}

/// One optimizer over the backbone and the head, both at `lr`.
fn optimizer(params: &ParamStore, algorithm: Algorithm, lr: f64) -> Result<Optimizer> {
    let group = |name: &str, prefix: &str| ParamGroup {
        name: name.into(),
        algorithm,
        lr,
        params: params.trainable(prefix),
    };
    Ok(Optimizer::new(vec![
        group("backbone", BACKBONE_PREFIX),
        group("head", HEAD_PREFIX),
    ])?)
}

/// Named vectors: one per parameter (its gradient, or its value after the optimizer steps).
type PerParam = Vec<(String, Vec<f64>)>;

/// Forward + backward of a model with the same seeded weights on both devices, then a few
/// optimizer steps: the outputs, every parameter's gradient and the updated parameters.
/// One model comparison.
#[derive(Clone, Copy)]
struct ModelCase {
    name: &'static str,
    algorithm: Algorithm,
    shape: (usize, usize, usize, usize),
    dtype: DType,
    frozen_bn: bool,
}

fn model_run(
    case: ModelCase,
    x: &[f64],
    steps: usize,
    dev: &Device,
) -> Result<(Vec<f64>, PerParam, PerParam)> {
    let ModelCase {
        name,
        algorithm,
        shape,
        dtype,
        frozen_bn,
    } = case;
    let config = model_config(name, frozen_bn)?;
    // The seeded initial weights are f32 values in either dtype (`models::params`), and the
    // input and the output's weights are rounded to f32 first: the f32 and f64 runs of a case
    // start from the same numbers, so that the f64 run is the f32 run's exact reference.
    let params = ParamStore::new(3);
    let model = EmbeddingNet::new(&config, params.var_builder(dtype, dev))?;
    let f32_values = |v: Vec<f64>, shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?
            .to_dtype(DType::F32)?
            .to_dtype(dtype)?
            .to_device(dev)?)
    };
    let input = f32_values(x.to_vec(), &[shape.0, shape.1, shape.2, shape.3])?;
    let out = model.forward_t(&input, true)?;
    let w = f32_values(normal(out.elem_count(), 5), out.dims())?;
    let grads = (out.clone() * w)?.sum_all()?.backward()?;
    let mut grad_values = Vec::new();
    for (n, var) in params.all() {
        if let Some(g) = grads.get(&var) {
            grad_values.push((n, host(g)?));
        }
    }
    let mut opt = optimizer(&params, algorithm, 1e-3)?;
    let labels = Labels::from_fine(&(0..shape.0).map(|i| (i / 2) as i64).collect::<Vec<_>>())?;
    let loss = Contrastive::default();
    let forward = |x: &Tensor| model.forward_t(x, true);
    for _ in 0..steps {
        let (_, g) = direct_gradients(&forward, &input, &labels, &loss)?;
        opt.step(&g)?;
    }
    let mut weights = Vec::new();
    for (n, var) in params.all() {
        weights.push((n, host(var.as_tensor())?));
    }
    Ok((host(&out)?, grad_values, weights))
}

/// The largest error over all parameters (relative to each parameter's own scale) and the three
/// worst parameters.
fn per_param_errors(a: &PerParam, b: &PerParam) -> (f64, Vec<(String, f64)>) {
    let mut errs: Vec<(String, f64)> = a
        .iter()
        .zip(b)
        .map(|((n, x), (_, y))| (n.clone(), rel_error(x, y)))
        .collect();
    errs.sort_by(|p, q| q.1.total_cmp(&p.1));
    let worst = errs.first().map_or(0.0, |e| e.1);
    errs.truncate(3);
    (worst, errs)
}

/// The values and optimizer state of three parameters (`n`, 7 and 16,384 values: one group's
/// Adam step is one launch over blocks of 16,384 values of each tensor) after `steps` updates
/// on `dev` (the gradients are those of `Σ θ ⊙ c`: `c` exactly, drawn anew for each step).
fn optimizer_run(
    algorithm: Algorithm,
    dtype: DType,
    n: usize,
    steps: usize,
    dev: &Device,
) -> Result<PerParam> {
    let sizes = [("w", n), ("b", 7), ("c", 16_384)];
    let thetas = sizes
        .iter()
        .enumerate()
        .map(|(k, &(_, len))| {
            let t = Tensor::from_vec(normal(len, 21 + k as u64), len, &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(dev)?;
            Ok(Var::from_tensor(&t)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut opt = Optimizer::new(vec![ParamGroup {
        name: "p".into(),
        algorithm,
        lr: 1e-2,
        params: sizes
            .iter()
            .zip(&thetas)
            .map(|(&(name, _), v)| (name.to_owned(), v.clone()))
            .collect(),
    }])?;
    for step in 0..steps {
        let mut total = Tensor::zeros((), dtype, dev)?;
        for (k, (&(_, len), theta)) in sizes.iter().zip(&thetas).enumerate() {
            let c = Tensor::from_vec(
                normal(len, 30 + 10 * step as u64 + k as u64),
                len,
                &Device::Cpu,
            )?
            .to_dtype(dtype)?
            .to_device(dev)?;
            total = (total + (theta.as_tensor() * c)?.sum_all()?)?;
        }
        opt.step(&total.backward()?)?;
    }
    let mut out = Vec::new();
    for (&(name, _), theta) in sizes.iter().zip(&thetas) {
        out.push((name.to_owned(), host(theta.as_tensor())?));
    }
    for (name, t) in opt.state_tensors()? {
        out.push((name, host(&t)?));
    }
    Ok(out)
}

/// The optimizers' updates on the device (in place, by the kernels of `train::optim::device`)
/// against the CPU's tensor formulation: three steps of every algorithm and option on three
/// parameters of 100,003, 7 and 16,384 values (one group; not all multiples of the blocks),
/// f32 and f64. The
/// arithmetic is the same operation by operation, so the values are expected equal
/// (`exact`), the status being the usual tolerance.
fn check_optimizers(report: &mut Report, dev: &Device) -> Result<()> {
    let decay = AdamConfig {
        weight_decay: 0.05,
        ..AdamConfig::default()
    };
    let low_beta = AdamConfig {
        beta1: 0.3,
        beta2: 0.5,
        eps: 1e-3,
        weight_decay: 0.01,
    };
    let variants = [
        ("Adam", Algorithm::Adam(AdamConfig::default())),
        ("Adam, weight decay 0.05", Algorithm::Adam(decay)),
        (
            "Adam, beta1 0.3 (lerp's other form)",
            Algorithm::Adam(low_beta),
        ),
        ("AdamW, weight decay 0.05", Algorithm::AdamW(decay)),
        ("SGD", Algorithm::Sgd(SgdConfig::default())),
        (
            "SGD, momentum 0.9, dampening 0.1, weight decay 1e-4",
            Algorithm::Sgd(SgdConfig {
                momentum: 0.9,
                dampening: 0.1,
                weight_decay: 1e-4,
                nesterov: false,
            }),
        ),
        (
            "SGD, Nesterov momentum 0.9",
            Algorithm::Sgd(SgdConfig {
                momentum: 0.9,
                nesterov: true,
                ..SgdConfig::default()
            }),
        ),
    ];
    let (n, steps) = (100_003, 3);
    for (name, algorithm) in variants {
        for dtype in [DType::F32, DType::F64] {
            if report.over_budget() {
                return Ok(());
            }
            let start = Instant::now();
            let entry = match (
                optimizer_run(algorithm, dtype, n, steps, &Device::Cpu),
                optimizer_run(algorithm, dtype, n, steps, dev),
            ) {
                (Ok(c), Ok(g)) => {
                    let (err, worst) = per_param_errors(&g, &c);
                    let exact = c.len() == g.len()
                        && c.iter().zip(&g).all(|(a, b)| a.0 == b.0 && a.1 == b.1);
                    let tol = tolerance(dtype);
                    let same_tensors =
                        c.len() == g.len() && c.iter().zip(&g).all(|(a, b)| a.0 == b.0);
                    json!({"kind": "optimizer", "name": format!("{name}, {steps} steps"),
                        "dtype": format!("{dtype:?}"), "values": n,
                        "tensors": c.iter().map(|t| t.0.clone()).collect::<Vec<_>>(),
                        "status": if err <= tol && same_tensors { "pass" } else { "fail" },
                        "rel_err_worst_tensor": err, "worst": worst, "exact": exact,
                        "tolerance": tol, "seconds": round(start.elapsed().as_secs_f64(), 3)})
                }
                (c, g) => json!({"kind": "optimizer", "name": name,
                    "dtype": format!("{dtype:?}"), "status": "error",
                    "error": format!("cpu: {:?}; device: {:?}", c.err().map(|e| e.to_string()),
                        g.err().map(|e| e.to_string()))}),
            };
            report.push("checks", entry)?;
        }
    }
    Ok(())
}

/// Why a model check passes although the device and the CPU differ by more than the tolerance.
const MODEL_REASON: &str = "rounding amplified by depth (BatchNorm over a few images, Adam \
    dividing by sqrt(v)): measured against the same case computed in f64 from the same \
    f32 numbers, the device's values are within 10 times the CPU's own f32 rounding error \
    (f64 runs: 10 times that error scaled by eps64 / eps32), quantity by quantity";

/// How much farther from the exact values the device may be than the CPU's own rounding: a
/// device computing another function (a wrong kernel, a lower-precision algorithm such as
/// TF32 or an FFT convolution) is off by far more.
const ROUNDING_FACTOR: f64 = 10.0;

/// The verdict of one model comparison.
struct ModelVerdict {
    pass: bool,
    /// Whether every quantity was within the tolerance of the CPU's in the same dtype.
    direct: bool,
    detail: Value,
}

/// A model case's device run against its CPU runs in f32 and f64 from the same f32 numbers
/// (weights, input, output weights). Each quantity — the output, each parameter's gradient,
/// each parameter after the optimizer steps — passes when the device is within the tolerance
/// of the CPU in its dtype or, failing that, when its error against the f64 run is at most
/// [`ROUNDING_FACTOR`] times the CPU's f32 rounding error there (for an f64 case, scaled by
/// `eps64 / eps32`: rounding grows linearly with the unit roundoff). Through a deep network
/// with batch statistics of 2–4 images, or Adam steps on parameters whose true gradient is
/// near zero, that rounding error is large, and the same on either device.
fn model_verdict(
    dtype: DType,
    cpu32: &(Vec<f64>, PerParam, PerParam),
    cpu64: &(Vec<f64>, PerParam, PerParam),
    device: &(Vec<f64>, PerParam, PerParam),
) -> ModelVerdict {
    let cpu = if dtype == DType::F64 { cpu64 } else { cpu32 };
    let tol = tolerance(dtype);
    let scale = if dtype == DType::F64 {
        f64::EPSILON / f64::from(f32::EPSILON)
    } else {
        1.0
    };
    let quantities = |run: &(Vec<f64>, PerParam, PerParam)| -> Vec<(String, Vec<f64>)> {
        let mut q = vec![("output".to_owned(), run.0.clone())];
        q.extend(run.1.iter().map(|(n, v)| (format!("grad {n}"), v.clone())));
        q.extend(
            run.2
                .iter()
                .map(|(n, v)| (format!("after steps {n}"), v.clone())),
        );
        q
    };
    let (d, c, r, p) = (
        quantities(device),
        quantities(cpu),
        quantities(cpu64),
        quantities(cpu32),
    );
    let (mut pass, mut direct) = (d.len() == r.len() && d.len() == p.len(), true);
    // The quantities by how close they come to their bound (error / bound), worst first.
    let mut worst: Vec<(f64, String, f64, f64)> = Vec::new();
    for (((name, dv), (_, cv)), ((_, rv), (_, pv))) in d.iter().zip(&c).zip(r.iter().zip(&p)) {
        if rel_error(dv, cv) <= tol {
            continue;
        }
        direct = false;
        let error = rel_error(dv, rv);
        let bound = tol.max(ROUNDING_FACTOR * rel_error(pv, rv) * scale);
        pass &= error <= bound;
        worst.push((error / bound, name.clone(), error, bound));
    }
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    let detail = json!({
        "quantities": d.len(),
        "outside_tolerance_of_cpu": worst.len(),
        "worst": worst.iter().take(3).map(|(ratio, name, error, bound)| json!({
            "quantity": name, "error_vs_f64": error, "bound": bound, "ratio": ratio,
        })).collect::<Vec<_>>(),
    });
    ModelVerdict {
        pass,
        direct,
        detail,
    }
}

fn check_models(report: &mut Report, dev: &Device, small: bool) -> Result<()> {
    check_optimizers(report, dev)?;
    let adam = Algorithm::Adam(AdamConfig::default());
    let sgd = Algorithm::Sgd(SgdConfig {
        momentum: 0.9,
        ..SgdConfig::default()
    });
    // Batch statistics of 2–4 images amplify rounding through a deep random network (BatchNorm
    // divides by the spread of a few values), so f32 agreement is also checked with frozen BN
    // (running statistics, as the RaMBO and FastAP recipes train), and the f64 runs check that
    // both devices compute the same function.
    let mut cases = vec![
        ("small_cnn", adam, (8, 3, 32, 32), DType::F32, false),
        ("small_cnn", sgd, (8, 3, 32, 32), DType::F32, false),
        ("small_cnn", adam, (8, 3, 32, 32), DType::F64, false),
    ];
    if !small {
        cases.push(("resnet18", adam, (4, 3, 64, 64), DType::F32, false));
        cases.push(("resnet18", adam, (4, 3, 64, 64), DType::F64, false));
        cases.push(("resnet50", adam, (4, 3, 64, 64), DType::F32, false));
        cases.push(("resnet50", sgd, (2, 3, 64, 64), DType::F64, false));
        cases.push(("resnet50", adam, (2, 3, 224, 224), DType::F32, false));
        cases.push(("resnet18", sgd, (4, 3, 64, 64), DType::F32, true));
        cases.push(("resnet50", sgd, (4, 3, 64, 64), DType::F32, true));
        cases.push(("resnet50", sgd, (2, 3, 224, 224), DType::F32, true));
    }
    for (name, algorithm, shape, dtype, frozen) in cases {
        let case = ModelCase {
            name,
            algorithm,
            shape,
            dtype,
            frozen_bn: frozen,
        };
        if report.over_budget() {
            return Ok(());
        }
        let start = Instant::now();
        let x = normal(shape.0 * shape.1 * shape.2 * shape.3, 9);
        let steps = 3;
        let in_dtype = |dtype| ModelCase { dtype, ..case };
        let runs = (|| -> Result<_> {
            Ok((
                model_run(in_dtype(DType::F32), &x, steps, &Device::Cpu)?,
                model_run(in_dtype(DType::F64), &x, steps, &Device::Cpu)?,
                model_run(case, &x, steps, dev)?,
            ))
        })();
        let entry = match runs {
            Ok((cpu32, cpu64, device)) => {
                let algo = match algorithm {
                    Algorithm::Adam(_) => "Adam",
                    Algorithm::Sgd(_) => "SGD momentum 0.9",
                    _ => "other",
                };
                let cpu = if dtype == DType::F64 { &cpu64 } else { &cpu32 };
                let verdict = model_verdict(dtype, &cpu32, &cpu64, &device);
                let mut entry = json!({
                    "kind": "model",
                    "name": format!("{name}{} forward+backward, {steps} {algo} steps",
                        if frozen { " (frozen BN)" } else { "" }),
                    "dtype": format!("{dtype:?}"),
                    "input": [shape.0, shape.1, shape.2, shape.3],
                    "status": if verdict.pass { "pass" } else { "fail" },
                    // The device against the CPU in the same dtype.
                    "output_rel_err": rel_error(&device.0, &cpu.0),
                    "grad_rel_err_worst_param": per_param_errors(&device.1, &cpu.1).0,
                    "weights_rel_err_worst_param_after_steps": per_param_errors(&device.2, &cpu.2).0,
                    "tolerance": tolerance(dtype),
                    "seconds": round(start.elapsed().as_secs_f64(), 3),
                });
                entry["against_f64_reference"] = verdict.detail;
                if verdict.pass && !verdict.direct {
                    entry["reason"] = json!(MODEL_REASON);
                }
                entry
            }
            Err(e) => json!({"kind": "model", "name": name, "dtype": format!("{dtype:?}"),
                "status": "error", "error": format!("{e:#}")}),
        };
        report.push("checks", entry)?;
    }
    Ok(())
}

/// Trains the embedded small-CNN recipe for 2 epochs straight, and 1 epoch + a resume from the
/// checkpoint written on the device: the weights must be bit-identical.
fn check_resume(report: &mut Report, device: &str, scratch: &Path) -> Result<()> {
    let start = Instant::now();
    let result = (|| -> Result<Value> {
        let mut config = TrainConfig::from_toml_file("configs/embedded_small_cnn.toml")?;
        config.device = DeviceChoice::parse(device)?;
        config.progress = false;
        let data = config
            .dataset
            .embedded_mut()
            .context("the resume check trains the embedded data")?;
        data.families = 4;
        data.variants_per_family = 2;
        data.fine_per_variant = 4;
        data.images_per_class = 8;
        config.epochs = 2;
        let mut straight = Trainer::from_config(config.clone())?;
        straight.fit()?;
        let run = scratch.join("resume_run");
        let _ = std::fs::remove_dir_all(&run);
        let mut first = config.clone();
        first.epochs = 1;
        first.output = OutputConfig {
            dir: Some(run.clone()),
            checkpoint_every: 1,
        };
        let mut t1 = Trainer::from_config(first)?;
        t1.fit()?;
        let ckpt = t1.checkpoint_path().context("no checkpoint written")?;
        drop(t1);
        let mut second = config.clone();
        second.resume = Some(ckpt);
        let mut t2 = Trainer::from_config(second)?;
        t2.fit()?;
        let bits = |t: &Trainer| -> Result<Vec<u32>> {
            let mut v = Vec::new();
            for (_, var) in t.params().all() {
                let x = var
                    .as_tensor()
                    .to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                v.extend(x.into_iter().map(f32::to_bits));
            }
            Ok(v)
        };
        let (a, b) = (bits(&straight)?, bits(&t2)?);
        let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        let same_loss =
            straight.log().series("train", "loss", None) == t2.log().series("train", "loss", None);
        Ok(json!({
            "kind": "checkpoint", "name": "resume on the device: 2 epochs vs 1 + resume",
            "status": if differing == 0 && a.len() == b.len() && same_loss { "pass" } else { "fail" },
            "parameters": a.len(), "differing_parameters": differing,
            "same_loss_series": same_loss,
        }))
    })();
    let mut entry = result.unwrap_or_else(|e| {
        json!({"kind": "checkpoint", "name": "resume", "status": "error", "error": format!("{e:#}")})
    });
    entry["seconds"] = json!(round(start.elapsed().as_secs_f64(), 3));
    report.push("checks", entry)
}

/// The loss formulations of `benches/loss_bench.rs` (the same as `losses_vs_torch.py`'s), for
/// the batch labelled `labels` (4 images per fine class, 2 coarse classes).
fn bench_loss(name: &str, labels: &Labels, d: usize, dev: &Device) -> Result<Box<dyn RankLoss>> {
    Ok(match name {
        "smooth-ap" => Box::new(SmoothAp::default()),
        // One proxy per fine class of the batch, in increasing order, on the embeddings' device.
        "happier" => Box::new(Happier::new(
            HapLoss::default(),
            ClusterLoss::for_level(labels, 0, d, 0, DType::F32, dev)?,
        )),
        "roadmap" => Box::new(Roadmap::default()),
        "fastap" => Box::new(FastAp::default()),
        "rambo" => Box::new(Rambo::recall(RecallWeight::LogLog)),
        // The papers' recipes: a score memory of τ = 7 batches, full before the timing.
        "rambo-memory" => {
            let loss = RamboWithMemory::new(Rambo::recall(RecallWeight::LogLog), 7);
            for _ in 0..7 {
                let e = Tensor::randn(0f32, 1.0, (labels.len(), d), dev)?;
                loss.forward(&e, labels)?;
            }
            Box::new(loss)
        }
        "contrastive" => Box::new(Contrastive::default()),
        "triplet-semihard" => Box::new(Triplet {
            mining: TripletMining::SemiHard,
            ..Triplet::default()
        }),
        // The plain tensor formulations of the pairwise losses (`forward_plain`: the `B × B`
        // graph on the device, autograd), beside their row engine (on the host): which one a
        // CUDA run should take is this benchmark's question.
        "fastap-plain" => plain(FastAp::default(), FastAp::forward_plain),
        "contrastive-plain" => plain(Contrastive::default(), Contrastive::forward_plain),
        "triplet-semihard-plain" => plain(
            Triplet {
                mining: TripletMining::SemiHard,
                ..Triplet::default()
            },
            Triplet::forward_plain,
        ),
        "nsm" => Box::new(NormSoftmax::for_level(labels, 0, d, 0, DType::F32, dev)?),
        "proxy-nca-pp" => Box::new(ProxyNcaPp::for_level(labels, 0, d, 0, DType::F32, dev)?),
        "proxy-nca" => Box::new(ProxyNca::for_level(labels, 0, d, 0, DType::F32, dev)?),
        "csl" => Box::new(Csl::new(labels, d, 0, DType::F32, dev)?),
        other => bail!("unknown loss {other}"),
    })
}

/// A loss's plain formulation as a [`RankLoss`].
struct Plain<F>(F);

impl<F: Fn(&Tensor, &Labels) -> rankwise::Result<Tensor>> RankLoss for Plain<F> {
    fn forward(&self, embeddings: &Tensor, labels: &Labels) -> rankwise::Result<Tensor> {
        (self.0)(embeddings, labels)
    }
}

fn plain<L: 'static>(
    loss: L,
    forward: fn(&L, &Tensor, &Labels) -> rankwise::Result<Tensor>,
) -> Box<dyn RankLoss> {
    Box::new(Plain(move |e: &Tensor, l: &Labels| forward(&loss, e, l)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Forward + backward of one loss at batch `b` on the device, median over the timed reps.
fn time_loss(name: &str, b: usize, dev: &Device, reps: usize) -> Result<(f64, f64, usize)> {
    let d = 512;
    let labels = Labels::new(
        (0..b as i64)
            .map(|i| vec![i / 4, 1_000_000 + (i / 4) % 2])
            .collect(),
    )?;
    let loss = bench_loss(name, &labels, d, dev)?;
    let data: Vec<f32> = normal(b * d, 0).into_iter().map(|v| v as f32).collect();
    let host_data = Tensor::from_vec(data, (b, d), &Device::Cpu)?;
    let mut times = Vec::new();
    let mut value = f64::NAN;
    for rep in 0..=reps {
        let emb = Var::from_tensor(&host_data.to_device(dev)?)?;
        dev.synchronize()?;
        let t0 = Instant::now();
        // As a training step runs it: the input checks decided on the device.
        let l = guard::deferred(|| loss.forward(emb.as_tensor(), &labels))?;
        let grads = l.backward()?;
        let g = grads.get(&emb).context("no gradient")?;
        // Reading a value back waits for the device.
        let _ = g.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let dt = t0.elapsed().as_secs_f64();
        value = l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        if rep > 0 {
            times.push(dt);
        }
    }
    Ok((median(times), value, reps))
}

/// The time of one candle operation on a 1-value tensor (an affine map, out of place), median
/// of 5 runs of 2000 chained ones, in µs: the floor per operation of a launch-bound loss step
/// (losses_vs_torch.py measures PyTorch's beside it). A loss's time at B = 256 over this floor
/// says how many operations' worth it spends.
fn op_floor(dev: &Device) -> Result<f64> {
    let ops = 2000;
    let mut x = Tensor::zeros(1, DType::F32, dev)?;
    for _ in 0..50 {
        x = x.affine(1.0, 0.0)?;
    }
    let mut per = Vec::new();
    for _ in 0..5 {
        dev.synchronize()?;
        let t = Instant::now();
        for _ in 0..ops {
            x = x.affine(1.0, 0.0)?;
        }
        dev.synchronize()?;
        per.push(t.elapsed().as_secs_f64() / ops as f64 * 1e6);
    }
    Ok(median(per))
}

fn bench_losses(report: &mut Report, dev: &Device, args: &Args) -> Result<()> {
    let (small, cap) = (args.small, args.cap);
    if args.losses.is_empty() || args.losses.iter().any(|l| l == "op-floor") {
        let entry = match op_floor(dev) {
            Ok(us) => json!({"kind": "op_floor", "status": "ok", "us_per_op": round(us, 3)}),
            Err(e) => json!({"kind": "op_floor", "status": "error", "error": format!("{e:#}")}),
        };
        report.push("benchmarks", entry)?;
    }
    // The costliest first: each loss gets an equal share of what is left, so a cheap loss
    // reaching the cap early leaves its time to the ones after it.
    let names = [
        "happier",
        "smooth-ap",
        "roadmap",
        "triplet-semihard",
        "fastap",
        "rambo",
        "rambo-memory",
        "contrastive",
        "nsm",
        "proxy-nca-pp",
        "proxy-nca",
        "csl",
        "triplet-semihard-plain",
        "fastap-plain",
        "contrastive-plain",
    ];
    let names: Vec<&str> = names
        .into_iter()
        .filter(|n| args.losses.is_empty() || args.losses.iter().any(|l| l == n))
        .collect();
    // Each loss gets an equal share of what is left of the budget for this section.
    let section_end = report.budget_s;
    for (i, name) in names.iter().enumerate() {
        let share = (section_end - report.elapsed()) / (names.len() - i) as f64;
        let loss_end = report.elapsed() + share;
        let mut b = if small { 64 } else { args.start_batch };
        // The memory ranks τ·B stored sequences on the host at every step: B = 256 (the
        // recipes take 128).
        let top = match (small, *name) {
            (true, _) => 256,
            (false, "rambo-memory") => cap.min(256),
            _ => cap,
        };
        while b <= top {
            if report.elapsed() > loss_end {
                report.push(
                    "benchmarks",
                    json!({"kind": "loss", "loss": name, "B": b, "status": "budget",
                        "note": "stopped: this loss's share of the time budget is spent"}),
                )?;
                break;
            }
            let reps = match b {
                0..=1024 => 10,
                1025..=4096 => 3,
                _ => 2,
            };
            let t_start = unix_ms();
            // The pool keeps freed memory (`rankwise::device`): the smaller batches' must not
            // count against the next one's fit.
            rankwise::device::release_pool(dev)?;
            match time_loss(name, b, dev, reps) {
                Ok((s, v, reps)) => report.push(
                    "benchmarks",
                    json!({"kind": "loss", "loss": name, "B": b, "D": 512, "status": "ok",
                        "ms_median": round(s * 1e3, 4), "reps": reps, "loss_value": v,
                        "unix_start_ms": t_start}),
                )?,
                Err(e) => {
                    report.push(
                        "benchmarks",
                        json!({"kind": "loss", "loss": name, "B": b, "status": "error",
                            "error": format!("{e:#}"), "unix_start_ms": t_start}),
                    )?;
                    break;
                }
            }
            // B = 256, then 4096, then doubling up to the cap: the largest B that fits.
            b = if b < 4096 { (b * 16).min(4096) } else { b * 2 };
        }
    }
    Ok(())
}

/// SOP-scale evaluation: 60,502 × 512 random embeddings in SOP's test shape (11,316 classes,
/// about 5 images each; 12 super-classes), every metric of `rankwise eval` and the top-1000
/// kNN, on the device.
fn bench_eval(report: &mut Report, dev: &Device, small: bool) -> Result<()> {
    let (n, d, classes) = if small {
        (3000, 64, 560)
    } else {
        (60_502, 512, 11_316)
    };
    let data: Vec<f32> = normal(n * d, 21).into_iter().map(|v| v as f32).collect();
    let x = Tensor::from_vec(data, (n, d), &Device::Cpu)?;
    let labels = Labels::new(
        (0..n)
            .map(|i| {
                let c = (i * classes / n) as i64;
                vec![c, 1_000_000 + c * 12 / classes as i64]
            })
            .collect(),
    )?;
    // By default a CUDA device ranks the scores itself (`retrieval::device_rank`) and only the
    // positives' positions reach the host. The same evaluations with the host's ranking follow:
    // the score chunks reach the host through reused page-locked buffers (`retrieval::pinned`,
    // the default) or candle's copies into fresh memory, for the side-by-side.
    let pinned = |on: bool| {
        retrieval::pinned::set_enabled(on);
        on
    };
    let every = "full ranking, every metric (H-AP, ASI, NDCG, per-level mAP, mAP@R, R@k)";
    let binary = "full ranking, fine-level binary metrics only";
    // (name, hierarchical and per-level metrics, device ranking, page-locked copies)
    for (label, all_metrics, device_ranking, pinned_copies) in [
        (every, true, true, true),
        (binary, false, true, true),
        (every, true, false, true),
        (binary, false, false, true),
        (binary, false, false, false),
    ] {
        if report.over_budget() {
            return Ok(());
        }
        let opts = EvalOptions {
            device: dev.clone(),
            hierarchical: all_metrics,
            per_level: all_metrics,
            ..EvalOptions::default()
        };
        pinned(pinned_copies);
        retrieval::device_rank::set_enabled(device_ranking);
        let t_start = unix_ms();
        let t0 = Instant::now();
        let result = retrieval::evaluate(&x, &labels, None, &opts);
        let seconds = round(t0.elapsed().as_secs_f64(), 3);
        let entry = match result {
            Ok(r) => json!({"kind": "eval", "name": label, "N": n, "D": d, "status": "ok",
                "device_ranking": device_ranking, "pinned_copies": pinned_copies,
                "seconds": seconds, "unix_start_ms": t_start,
                "metrics": r.rows.iter().map(|m| json!([m.metric, m.level, m.value])).collect::<Vec<_>>()}),
            Err(e) => json!({"kind": "eval", "name": label, "device_ranking": device_ranking,
                "pinned_copies": pinned_copies, "status": "error", "error": format!("{e:#}")}),
        };
        pinned(true);
        retrieval::device_rank::set_enabled(true);
        report.push("benchmarks", entry)?;
    }
    // The device's share of the host-ranking evaluations above: the chunk products (512
    // queries, the engine's default) and their copies to the host, without the ranking that the
    // engine overlaps with them (retrieval::for_each_chunk).
    if !report.over_budget() {
        let t_start = unix_ms();
        let t0 = Instant::now();
        let result = (|| -> Result<f64> {
            let e = rankwise::losses::l2_normalize(&x.to_device(dev)?, "embeddings")?;
            let et = e.t()?.contiguous()?;
            let mut checksum = 0.0f64;
            for start in (0..n).step_by(512) {
                let len = 512.min(n - start);
                let s = e
                    .narrow(0, start, len)?
                    .matmul(&et)?
                    .to_device(&Device::Cpu)?;
                let host = s.flatten_all()?.to_vec1::<f32>()?;
                checksum += f64::from(host[host.len() / 2]);
            }
            Ok(checksum)
        })();
        let entry = match result {
            Ok(checksum) => {
                json!({"kind": "eval", "name": "scores only: chunk products on the device and candle's copies to the host (fresh memory, not page-locked)",
                "N": n, "D": d, "status": "ok", "seconds": round(t0.elapsed().as_secs_f64(), 3),
                "unix_start_ms": t_start, "checksum": checksum})
            }
            Err(e) => {
                json!({"kind": "eval", "name": "scores only", "status": "error", "error": format!("{e:#}")})
            }
        };
        report.push("benchmarks", entry)?;
    }
    let k = if small { 100 } else { 1000 };
    // (device candidates, page-locked copies of the host's path)
    for (device_ranking, pinned_copies) in [(true, true), (false, true), (false, false)] {
        if report.over_budget() {
            return Ok(());
        }
        pinned(pinned_copies);
        retrieval::device_rank::set_enabled(device_ranking);
        let t_start = unix_ms();
        let t0 = Instant::now();
        let result = retrieval::knn_with(
            &x,
            &x,
            k,
            SelfMatch::SameIndex,
            128,
            Similarity::Cosine,
            dev,
            false,
        );
        let seconds = round(t0.elapsed().as_secs_f64(), 3);
        pinned(true);
        retrieval::device_rank::set_enabled(true);
        let entry = match result {
            Ok(r) => json!({"kind": "eval", "name": format!("top-{k} kNN"), "N": n, "D": d,
                "status": "ok", "device_ranking": device_ranking, "pinned_copies": pinned_copies,
                "seconds": seconds, "unix_start_ms": t_start,
                "first_neighbours": r.neighbours(0)[..5].to_vec()}),
            Err(e) => json!({"kind": "eval", "name": "kNN", "device_ranking": device_ranking,
                "pinned_copies": pinned_copies, "status": "error", "error": format!("{e:#}")}),
        };
        report.push("benchmarks", entry)?;
    }
    Ok(())
}

/// The training benchmarks' network and step: the model `name` with seeded weights, Adam at
/// 1e-4, and the contrastive loss over classes of 4 consecutive images (as the PyTorch anchor,
/// `benches/train_throughput_vs_torch.py`).
struct TrainBench {
    model: EmbeddingNet,
    opt: Optimizer,
    labels: Labels,
    loss: Contrastive,
}

impl TrainBench {
    fn new(name: &str, batch: usize, dev: &Device) -> Result<Self> {
        let params = ParamStore::new(0);
        let model = EmbeddingNet::new(
            &model_config(name, false)?,
            params.var_builder(DType::F32, dev),
        )?;
        let opt = optimizer(&params, Algorithm::Adam(AdamConfig::default()), 1e-4)?;
        let labels = Labels::from_fine(&(0..batch).map(|i| (i / 4) as i64).collect::<Vec<_>>())?;
        Ok(TrainBench {
            model,
            opt,
            labels,
            loss: Contrastive::default(),
        })
    }

    /// The loss value and gradients of the batch `x` (training mode).
    fn gradients(&self, x: &Tensor) -> Result<(f64, candle_core::backprop::GradStore)> {
        let forward = |x: &Tensor| self.model.forward_t(x, true);
        Ok(direct_gradients(&forward, x, &self.labels, &self.loss)?)
    }

    /// One training step on `x`: its loss value.
    fn step(&mut self, x: &Tensor) -> Result<f64> {
        let (l, g) = self.gradients(x)?;
        self.opt.step(&g)?;
        Ok(l)
    }
}

/// Training throughput (images/s of forward + backward + Adam step), as
/// `examples/train_throughput.rs` measures it on the CPU and `train_throughput_vs_torch.py` on
/// the same GPU.
fn bench_train(report: &mut Report, dev: &Device, small: bool, models: &[String]) -> Result<()> {
    for name in models {
        let name = name.as_str();
        let (size, batch, steps) = match (name, small) {
            (_, true) => (32, 16, 2),
            ("small_cnn", false) => (32, 64, 30),
            _ => (224, 256, 5),
        };
        if report.over_budget() {
            return Ok(());
        }
        let t_start = unix_ms();
        let result = (|| -> Result<Value> {
            let mut bench = TrainBench::new(name, batch, dev)?;
            let x = Tensor::from_vec(
                normal(batch * 3 * size * size, 4)
                    .into_iter()
                    .map(|v| v as f32)
                    .collect::<Vec<_>>(),
                (batch, 3, size, size),
                &Device::Cpu,
            )?
            .to_device(dev)?;
            // The peak from before the first step (Adam's state is made by it), as
            // `train_throughput_vs_torch.py` resets PyTorch's.
            rankwise::device::reset_peak_memory(dev)?;
            bench.step(&x)?;
            dev.synchronize()?;
            let t0 = Instant::now();
            let mut last = 0.0;
            for _ in 0..steps {
                last = bench.step(&x)?;
            }
            dev.synchronize()?;
            let secs = t0.elapsed().as_secs_f64();
            let peak_mib =
                rankwise::device::peak_memory(dev)?.map(|b| round(b as f64 / 1048576.0, 1));
            // Where the step's time goes: the forward pass alone (training mode), to set against
            // the whole step.
            let t1 = Instant::now();
            for _ in 0..steps {
                let _ = bench
                    .model
                    .forward_t(&x, true)?
                    .sum_all()?
                    .to_vec0::<f32>()?;
            }
            let forward = t1.elapsed().as_secs_f64();
            // The optimizer's step alone, on one step's gradients: by the in-place kernels
            // (`train::optim::device`, the default) and, for the side-by-side, by the tensor
            // formulation (the kernels' switch off for these steps only).
            let (_, g) = bench.gradients(&x)?;
            let mut time_opt = |kernels: bool| -> Result<f64> {
                let was = rankwise::kernels::enabled();
                rankwise::kernels::set_enabled(kernels);
                dev.synchronize()?;
                let t = Instant::now();
                let stepped = (0..steps).try_for_each(|_| bench.opt.step(&g));
                dev.synchronize()?;
                rankwise::kernels::set_enabled(was);
                stepped?;
                Ok(t.elapsed().as_secs_f64() / steps as f64)
            };
            let optimizer_kernels = time_opt(true)?;
            let optimizer_tensor_ops = time_opt(false)?;
            // The same steps with the memory pool handing its freed memory back at every
            // synchronisation (CUDA's default; each step reads its loss value), for the
            // side-by-side with the pool that keeps it (`rankwise::device`).
            // At most 3 steps, and only within the budget: a side-by-side, not a target.
            let released =
                if rankwise::device::pool_retention() && dev.is_cuda() && !report.over_budget() {
                    let n = steps.min(3);
                    rankwise::device::set_pool_retention(dev, false)?;
                    dev.synchronize()?;
                    let t = Instant::now();
                    let stepped = (0..n).try_for_each(|_| bench.step(&x).map(|_| ()));
                    dev.synchronize()?;
                    let secs = t.elapsed().as_secs_f64();
                    rankwise::device::set_pool_retention(dev, true)?;
                    stepped?;
                    json!(round(secs / n as f64, 4))
                } else {
                    Value::Null
                };
            Ok(
                json!({"kind": "train", "model": name, "size": size, "batch": batch,
                "steps": steps, "status": "ok",
                "images_per_s": round((steps * batch) as f64 / secs, 2),
                "s_per_step": round(secs / steps as f64, 4),
                "forward_s_per_step": round(forward / steps as f64, 4),
                "optimizer_s_per_step": round(optimizer_kernels, 5),
                "optimizer_tensor_ops_s_per_step": round(optimizer_tensor_ops, 5),
                "s_per_step_pool_released_at_sync": released,
                "peak_mib": peak_mib,
                "last_loss": last}),
            )
        })();
        let mut entry = result.unwrap_or_else(|e| {
            json!({"kind": "train", "model": name, "size": size, "batch": batch,
                "status": "error", "error": format!("{e:#}")})
        });
        entry["unix_start_ms"] = json!(t_start);
        report.push("benchmarks", entry)?;
    }
    Ok(())
}

/// The image pipeline onto the device (`--only pipeline`): a synthetic SOP dataset in its real
/// on-disk format, decoded and augmented by the loader (ImageNet training transform, 224 × 224)
/// and put on the device by the loader's thread, from page-locked buffers
/// (`rankwise::data::staging`) and, switched off, from pageable memory. A check that the batches
/// on the device are the CPU's bit for bit both ways; then, both ways, the loader alone
/// (batches streamed onto the device, images/s) and training through it (ResNet-50, batch 256,
/// forward + backward + Adam: what a run on real data does; `--small`: the small CNN, batch 4),
/// beside the `train` entries whose batch stays on the device.
fn pipeline(report: &mut Report, dev: &Device, small: bool, scratch: &Path) -> Result<()> {
    use rankwise::data::loaders::sop;
    use rankwise::data::pipeline::{LoaderConfig, Transform};
    use rankwise::data::synthetic_on_disk::{write_dataset, OnDiskSpec, SyntheticKind};
    use rankwise::data::{staging, ImageSource, OnDiskSource, View};
    let (model_name, batch, steps, classes, per_class, image_size) = if small {
        ("small_cnn", 4, 2, 4, 4, 48)
    } else {
        ("resnet50", 256, 5, 64, 8, 256)
    };
    let t_start = unix_ms();
    let root = scratch.join("pipeline_sop");
    let spec = OnDiskSpec {
        train_classes: classes,
        train_images_per_class: per_class,
        test_classes: 2,
        test_images_per_class: 2,
        super_classes: 2,
        image_size,
        seed: 0,
    };
    let source = (|| -> Result<OnDiskSource> {
        write_dataset(SyntheticKind::Sop, &root, &spec)?;
        let data = sop::load(&root)?;
        let loader = LoaderConfig {
            prefetch: 2,
            ..LoaderConfig::default()
        };
        Ok(OnDiskSource::new(
            "synthetic SOP train",
            data.train,
            Transform::retrieval_train(),
            Transform::retrieval_test(),
            loader,
        )?)
    })();
    let source = match source {
        Ok(s) => s,
        Err(e) => {
            let entry = json!({"kind": "pipeline", "name": "synthetic SOP dataset",
                "status": "error", "error": format!("{e:#}"), "unix_start_ms": t_start});
            return report.push("checks", entry);
        }
    };
    let n = source.labels().len();
    // `steps + 1` batches (the first untimed), items spread over the dataset.
    let batches: Vec<Vec<usize>> = (0..=steps)
        .map(|s| (0..batch).map(|i| (s * batch + i) * 7 % n).collect())
        .collect();
    let view = View::Train { epoch: 0 };
    let was = staging::enabled();
    for pinned in [true, false] {
        staging::set_enabled(pinned);
        // The check: the first two batches on the device equal the CPU's, bit for bit.
        let t0 = unix_ms();
        let result = (|| -> Result<Value> {
            let bits = |t: &Tensor| -> Result<Vec<u32>> {
                let v = t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
                Ok(v.into_iter().map(f32::to_bits).collect())
            };
            let mut differing = Vec::new();
            for (k, b) in source.stream(batches[..2].to_vec(), view, dev)?.enumerate() {
                let b = b?;
                let want = source.batch(&batches[k], view, &Device::Cpu)?;
                if bits(&b.images)? != bits(&want)? || b.indices != batches[k] {
                    differing.push(k);
                }
            }
            Ok(
                json!({"kind": "pipeline", "name": "batches on the device = the CPU's",
                "pinned_uploads": pinned, "batches": 2, "batch": batch,
                "differing_batches": differing,
                "status": if differing.is_empty() { "pass" } else { "fail" }}),
            )
        })();
        let mut entry = result.unwrap_or_else(|e| {
            json!({"kind": "pipeline", "name": "batches on the device = the CPU's",
                "pinned_uploads": pinned, "status": "error", "error": format!("{e:#}")})
        });
        entry["unix_start_ms"] = json!(t0);
        report.push("checks", entry)?;
        if report.over_budget() {
            break;
        }
        // The timings: the loader alone, then training through it.
        let t0 = unix_ms();
        let result = (|| -> Result<Value> {
            let t = Instant::now();
            for b in source.stream(batches.clone(), view, dev)? {
                b?;
            }
            dev.synchronize()?;
            let loader_secs = t.elapsed().as_secs_f64();
            let mut bench = TrainBench::new(model_name, batch, dev)?;
            let mut timed = None;
            let mut last = 0.0;
            for (k, b) in source.stream(batches.clone(), view, dev)?.enumerate() {
                last = bench.step(&b?.images)?;
                if k == 0 {
                    dev.synchronize()?;
                    timed = Some(Instant::now());
                }
            }
            dev.synchronize()?;
            let secs = timed.map_or(0.0, |t| t.elapsed().as_secs_f64());
            Ok(
                json!({"kind": "train-pipeline", "model": model_name, "size": 224,
                "batch": batch, "steps": steps, "pinned_uploads": pinned, "status": "ok",
                "loader_images_per_s": round(((steps + 1) * batch) as f64 / loader_secs, 2),
                "images_per_s": round((steps * batch) as f64 / secs, 2),
                "s_per_step": round(secs / steps as f64, 4),
                "last_loss": last}),
            )
        })();
        let mut entry = result.unwrap_or_else(|e| {
            json!({"kind": "train-pipeline", "model": model_name, "batch": batch,
                "pinned_uploads": pinned, "status": "error", "error": format!("{e:#}")})
        });
        entry["unix_start_ms"] = json!(t0);
        report.push("benchmarks", entry)?;
        if report.over_budget() {
            break;
        }
    }
    staging::set_enabled(was);
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    rankwise::cpu::alloc::tune_allocator();
    let device = DeviceChoice::parse(&args.device)?.device()?;
    let mut report = Report::new(&args.out, &args.device, args.budget_s)?;
    let wants = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    // The parts of `correctness`, each also asked for by itself.
    let check = |part: &str| wants("correctness") || wants(part);
    let scratch = std::env::temp_dir().join(format!("gpu_check_{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    // The few large checks first; the many loss checks stop at the budget.
    if check("threads") {
        check_threads(&mut report, &device)?;
    }
    if check("metrics") {
        check_metrics(&mut report, &device, args.small)?;
    }
    if check("models") {
        check_models(&mut report, &device, args.small)?;
    }
    if check("resume") {
        check_resume(&mut report, &args.device, &scratch)?;
    }
    if check("loss-checks") {
        check_losses(&mut report, &device, args.small, &args.families)?;
    }
    if wants("eval") {
        rankwise::device::release_pool(&device)?;
        bench_eval(&mut report, &device, args.small)?;
    }
    if wants("train") {
        rankwise::device::release_pool(&device)?;
        bench_train(&mut report, &device, args.small, &args.models)?;
    }
    if wants("losses") {
        bench_losses(&mut report, &device, &args)?;
    }
    if wants("pipeline") {
        rankwise::device::release_pool(&device)?;
        pipeline(&mut report, &device, args.small, &scratch)?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let count = |status: &str| {
        report.doc["checks"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|c| c["status"] == status).count())
    };
    let summary = json!({
        "pass": count("pass"), "fail": count("fail"), "error": count("error"),
        "seconds": round(report.elapsed(), 1),
    });
    report.doc["summary"] = summary.clone();
    report.save()?;
    eprintln!("[gpu_check] done: {summary}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of one output and one parameter (its gradient and its value after the steps).
    fn run(output: f64, grad: f64, after: f64) -> (Vec<f64>, PerParam, PerParam) {
        (
            vec![output, 1.0],
            vec![("w".into(), vec![grad, 1.0])],
            vec![("w".into(), vec![after, 1.0])],
        )
    }

    #[test]
    fn a_model_passes_within_the_tolerance_or_the_cpus_own_rounding() {
        let exact = run(0.5, 0.5, 0.5);
        // The CPU's f32 run is 1e-2 from the exact values in the gradient.
        let cpu32 = run(0.5, 0.51, 0.5);
        // Equal to the CPU: passes directly.
        let v = model_verdict(DType::F32, &cpu32, &exact, &cpu32.clone());
        assert!(v.pass && v.direct);
        // 5e-2 from the exact gradient: outside the tolerance, inside 10 × 1e-2.
        let v = model_verdict(DType::F32, &cpu32, &exact, &run(0.5, 0.55, 0.5));
        assert!(v.pass && !v.direct, "{}", v.detail);
        assert_eq!(v.detail["outside_tolerance_of_cpu"], 1);
        // 0.2 from it: another function.
        let v = model_verdict(DType::F32, &cpu32, &exact, &run(0.5, 0.7, 0.5));
        assert!(!v.pass, "{}", v.detail);
        assert_eq!(v.detail["worst"][0]["quantity"], "grad w");
        // Off in the output, where the CPU's f32 run is exact: only the tolerance holds.
        let v = model_verdict(DType::F32, &cpu32, &exact, &run(0.5 + 1e-3, 0.51, 0.5));
        assert!(!v.pass);
        // An f64 case: 10 times the f32 error scaled by eps64 / eps32 (0.1 → 1.86e-9), above
        // the f64 tolerance (1e-9).
        let rough = run(0.5, 0.6, 0.5);
        let v = model_verdict(DType::F64, &rough, &exact, &run(0.5, 0.5 + 1.5e-9, 0.5));
        assert!(v.pass && !v.direct, "{}", v.detail);
        let v = model_verdict(DType::F64, &rough, &exact, &run(0.5, 0.5 + 3e-9, 0.5));
        assert!(!v.pass, "{}", v.detail);
    }
}

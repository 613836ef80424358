//! Losses benchmark of issue 3: forward + backward wall time and peak resident memory of every
//! loss at `B ∈ {128, 256, 384, 1024, 4096}`, `D = 512`, `f32`, on the CPU, to compare with the
//! straightforward PyTorch implementations of `benches/losses_vs_torch.py` (results and
//! commands in `benches/losses_vs_torch.md`).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo bench --bench loss_bench                         # everything
//! RAYON_NUM_THREADS=2 cargo bench --bench loss_bench -- --loss smooth-ap --batch 4096
//! cargo bench --bench loss_bench -- --check target/losses_check.json
//! ```
//!
//! Losses (`--loss`, repeatable; default all): `smooth-ap` (paper: query not in its own list),
//! `happier` (`HapLoss::default()` — paper mode, `H-rank^>` optimised — plus the 0.1-weighted
//! clustering loss), `roadmap` (`Roadmap::default()`: SupAP + the 0.9/0.6 calibration, weights 1/1), `fastap` (10 bins), `rambo` (recall, log log), `contrastive` (0.9/0.6),
//! `triplet-semihard` (FaceNet semi-hard, margin 0.05), `nsm` (normalised softmax, σ = 0.05, one
//! proxy per class of the batch), `proxy-nca-pp` (ProxyNCA++, T = 1/9, one proxy per class of the
//! batch), `proxy-nca` (ProxyNCA as Roth & Brattoli re-implemented it, scale 3, one proxy per
//! class of the batch) and `csl` (HAPPIER's CSL baseline: s = 32, margins 0.25 /
//! 0.45, one proxy per class of the batch). `--batch` is repeatable too.
//!
//! Labels: 4 images per fine class (`fine = i / 4`), and 2 coarse classes per batch
//! (`coarse = fine mod 2`, SOP's hierarchical sampler), used by HAPPIER and CSL only. Embeddings:
//! standard normal (ChaCha8, seed 0), L2-normalised inside each loss.
//!
//! Each configuration: one warm-up run, then timed runs of forward + backward (the gradient is
//! read back to force it) — `--reps N` of them, or by default at least 5 up to B = 384, 3 at
//! 1024, 2 at 4096, and more until the timed runs add up to 1 s (at most 200), so that fast
//! configurations are timed in their steady state — and the median is reported. The peak RSS (`VmHWM`) is reset through `/proc/self/clear_refs` before each
//! configuration (after the embeddings are made), so it is the peak of that configuration plus
//! the process's baseline; for a clean number run one configuration per process. One JSON line
//! per configuration on stdout.
//!
//! The allocator is tuned first ([`rankwise::cpu::alloc::tune_allocator`], as `rankwise train`,
//! `reproduce` and the notebooks do); `--no-malloc-tuning` leaves glibc's defaults, under which
//! every `B × B` intermediate above 128 KiB is a fresh `mmap` whose pages fault in again.
//! candle's thread pools are then set as `rankwise train` sets them
//! ([`rankwise::cpu::threads::tune_candle_threads`]: on at most two cores, element-wise ops on the
//! calling thread; `RANKWISE_NO_THREAD_TUNING=1` leaves candle's default); the JSON line says
//! which (`candle_threads`).
//!
//! `--check PATH` writes a B = 64, D = 512 `f64` batch, its labels, our Smooth-AP, RaMBO,
//! ROADMAP, NSM, ProxyNCA++ and CSL values and gradients (and the proxies of the last three) to `PATH` (JSON),
//! for the cross-check in `losses_vs_torch.py`.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rankwise::losses::cluster::ClusterLoss;
use rankwise::losses::contrastive::Contrastive;
use rankwise::losses::csl::Csl;
use rankwise::losses::fastap::FastAp;
use rankwise::losses::happier::{HapLoss, Happier};
use rankwise::losses::norm_softmax::NormSoftmax;
use rankwise::losses::proxy_nca::ProxyNca;
use rankwise::losses::proxy_nca_pp::ProxyNcaPp;
use rankwise::losses::rambo::{Rambo, RecallWeight};
use rankwise::losses::roadmap::Roadmap;
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::losses::triplet::{Triplet, TripletMining};
use rankwise::losses::RankLoss;
use rankwise::Labels;
use std::time::Instant;

const DIM: usize = 512;
const LOSSES: [&str; 11] = [
    "smooth-ap",
    "happier",
    "roadmap",
    "fastap",
    "rambo",
    "contrastive",
    "triplet-semihard",
    "nsm",
    "proxy-nca-pp",
    "proxy-nca",
    "csl",
];
const BATCHES: [usize; 5] = [128, 256, 384, 1024, 4096];
/// Timed steps are added until they sum to this many seconds (see [`bench`]).
const TIME_BUDGET_S: f64 = 1.0;
/// The most timed steps of a configuration without `--reps`.
const MAX_REPS: usize = 200;

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn reset_peak_rss() {
    // "5" resets VmHWM to the current RSS (Linux ≥ 4.0); ignored elsewhere.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Fine class `i / 4`, coarse class `fine mod 2` (two coarse classes per batch).
fn labels(b: usize) -> Result<Labels> {
    Ok(Labels::new(
        (0..b as i64)
            .map(|i| {
                let fine = i / 4;
                vec![fine, 1_000_000 + fine % 2]
            })
            .collect(),
    )?)
}

fn make_loss(name: &str, y: &Labels) -> Result<Box<dyn RankLoss>> {
    Ok(match name {
        "smooth-ap" => Box::new(SmoothAp::default()),
        "happier" => {
            let cluster = ClusterLoss::for_level(y, 0, DIM, 0, DType::F32, &Device::Cpu)?;
            Box::new(Happier::new(HapLoss::default(), cluster))
        }
        "roadmap" => Box::new(Roadmap::default()),
        "fastap" => Box::new(FastAp::default()),
        "rambo" => Box::new(Rambo::recall(RecallWeight::LogLog)),
        "contrastive" => Box::new(Contrastive::default()),
        "triplet-semihard" => Box::new(Triplet {
            mining: TripletMining::SemiHard,
            ..Triplet::default()
        }),
        "nsm" => Box::new(NormSoftmax::for_level(
            y,
            0,
            DIM,
            0,
            DType::F32,
            &Device::Cpu,
        )?),
        "proxy-nca-pp" => Box::new(ProxyNcaPp::for_level(
            y,
            0,
            DIM,
            0,
            DType::F32,
            &Device::Cpu,
        )?),
        "proxy-nca" => Box::new(ProxyNca::for_level(y, 0, DIM, 0, DType::F32, &Device::Cpu)?),
        "csl" => Box::new(Csl::new(y, DIM, 0, DType::F32, &Device::Cpu)?),
        other => bail!("unknown loss {other}; one of {LOSSES:?}"),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(
    name: &str,
    b: usize,
    reps: Option<usize>,
    malloc_tuned: bool,
    threads: rankwise::cpu::threads::ThreadTuning,
) -> Result<()> {
    // `--reps N`: exactly N timed steps. Default: at least MIN_REPS(B), then more until the
    // timed steps add up to TIME_BUDGET (at most MAX_REPS), so that a fast configuration is
    // measured in its steady state rather than over its first few steps (page faults of fresh
    // buffers, threads starting), as a training loop sees it.
    let (min_reps, max_reps) = match reps {
        Some(n) => (n, n),
        None => (
            match b {
                0..=384 => 5,
                385..=1024 => 3,
                _ => 2,
            },
            MAX_REPS,
        ),
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let data: Vec<f32> = (0..b * DIM)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    let y = labels(b)?;
    let loss = make_loss(name, &y)?;
    reset_peak_rss();
    let mut times = Vec::new();
    let mut value = f32::NAN;
    let mut rep = 0;
    while times.len() < min_reps
        || (times.len() < max_reps && times.iter().sum::<f64>() < TIME_BUDGET_S)
    {
        let emb = Var::from_vec(data.clone(), (b, DIM), &Device::Cpu)?;
        let t0 = Instant::now();
        let l = loss.forward(emb.as_tensor(), &y)?;
        let grads = l.backward()?;
        let g = grads.get(&emb).context("no gradient for the embeddings")?;
        let _ = g.sum_all()?.to_scalar::<f32>()?;
        let dt = t0.elapsed().as_secs_f64();
        value = l.to_scalar::<f32>()?;
        if rep > 0 {
            times.push(dt);
        }
        rep += 1;
    }
    let reps = times.len();
    let line = serde_json::json!({
        "impl": "rankwise",
        "loss": name,
        "B": b,
        "D": DIM,
        "threads": rayon::current_num_threads(),
        "malloc_tuned": malloc_tuned,
        "candle_threads": format!("{threads:?}"),
        "reps": reps,
        "seconds": median(times.clone()),
        "seconds_all": times,
        "loss_value": value,
        "peak_rss_mib": peak_rss_mib(),
    });
    println!("{line}");
    Ok(())
}

/// The value and the input gradient (row-major) of `loss` on `data` (`b × DIM`, `f64`).
fn value_and_gradient(
    loss: &dyn RankLoss,
    data: &[f64],
    y: &Labels,
    b: usize,
) -> Result<(f64, Vec<f64>)> {
    let emb = Var::from_tensor(&Tensor::from_vec(data.to_vec(), (b, DIM), &Device::Cpu)?)?;
    let l = loss.forward(emb.as_tensor(), y)?;
    let grads = l.backward()?;
    let g = grads
        .get(&emb)
        .context("no gradient")?
        .flatten_all()?
        .to_vec1::<f64>()?;
    Ok((l.to_scalar::<f64>()?, g))
}

/// Writes a B = 64 `f64` batch with our Smooth-AP, RaMBO (recall, log log: the benchmark's
/// configuration), ROADMAP, NSM, ProxyNCA++, ProxyNCA and CSL values and gradients (with the four
/// proxy losses' proxies, seed 0, `f64`), for the cross-check in `losses_vs_torch.py`.
fn write_check(path: &str) -> Result<()> {
    let b = 64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(64);
    let data: Vec<f64> = (0..b * DIM)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    let y = labels(b)?;
    let (smooth_ap, smooth_ap_grad) = value_and_gradient(&SmoothAp::default(), &data, &y, b)?;
    let rambo_loss = make_loss("rambo", &y)?;
    let (rambo, rambo_grad) = value_and_gradient(rambo_loss.as_ref(), &data, &y, b)?;
    let (roadmap, roadmap_grad) = value_and_gradient(&Roadmap::default(), &data, &y, b)?;
    let nsm_loss = NormSoftmax::for_level(&y, 0, DIM, 0, DType::F64, &Device::Cpu)?;
    let (nsm, nsm_grad) = value_and_gradient(&nsm_loss, &data, &y, b)?;
    let pnca_loss = ProxyNcaPp::for_level(&y, 0, DIM, 0, DType::F64, &Device::Cpu)?;
    let (pnca, pnca_grad) = value_and_gradient(&pnca_loss, &data, &y, b)?;
    let nca_loss = ProxyNca::for_level(&y, 0, DIM, 0, DType::F64, &Device::Cpu)?;
    let (nca, nca_grad) = value_and_gradient(&nca_loss, &data, &y, b)?;
    let csl_loss = Csl::new(&y, DIM, 0, DType::F64, &Device::Cpu)?;
    let (csl, csl_grad) = value_and_gradient(&csl_loss, &data, &y, b)?;
    let flat = |v: &Var| -> Result<Vec<f64>> { Ok(v.as_tensor().flatten_all()?.to_vec1::<f64>()?) };
    let out = serde_json::json!({
        "B": b,
        "D": DIM,
        "fine": y.column(0),
        "coarse": y.column(1),
        "embeddings": data,
        "smooth_ap_loss": smooth_ap,
        "smooth_ap_grad": smooth_ap_grad,
        "rambo_loss": rambo,
        "rambo_grad": rambo_grad,
        "roadmap_loss": roadmap,
        "roadmap_grad": roadmap_grad,
        "nsm_loss": nsm,
        "nsm_grad": nsm_grad,
        "nsm_proxies": flat(nsm_loss.proxies())?,
        "proxy_nca_pp_loss": pnca,
        "proxy_nca_pp_grad": pnca_grad,
        "proxy_nca_pp_proxies": flat(pnca_loss.proxies())?,
        "proxy_nca_loss": nca,
        "proxy_nca_grad": nca_grad,
        "proxy_nca_proxies": flat(nca_loss.proxies())?,
        "csl_loss": csl,
        "csl_grad": csl_grad,
        "csl_proxies": flat(csl_loss.proxies())?,
    });
    std::fs::write(path, out.to_string())?;
    println!(
        "{}",
        serde_json::json!({"check": ["smooth-ap", "rambo", "roadmap", "nsm", "proxy-nca-pp", "proxy-nca", "csl"],
            "B": b, "dtype": "f64", "smooth_ap_loss": smooth_ap, "rambo_loss": rambo,
            "roadmap_loss": roadmap, "nsm_loss": nsm, "proxy_nca_pp_loss": pnca,
            "proxy_nca_loss": nca, "csl_loss": csl,
            "written": path})
    );
    Ok(())
}

fn main() -> Result<()> {
    let mut losses: Vec<String> = Vec::new();
    let mut batches: Vec<usize> = Vec::new();
    let mut reps = None;
    let mut tune_malloc = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--loss" => losses.push(args.next().context("--loss NAME")?),
            "--batch" => batches.push(args.next().context("--batch B")?.parse()?),
            "--reps" => reps = Some(args.next().context("--reps N")?.parse()?),
            "--no-malloc-tuning" => tune_malloc = false,
            // `--check-smooth-ap`: the name from before RaMBO joined the check.
            "--check" | "--check-smooth-ap" => {
                return write_check(&args.next().context("--check PATH")?)
            }
            // `cargo bench` passes `--bench` to harness-less targets.
            "--bench" => {}
            other => bail!("unknown argument {other}"),
        }
    }
    // As `rankwise train` / `reproduce` and the notebooks run the losses: glibc keeps freed
    // buffers instead of mapping and zero-filling fresh pages for every B × B intermediate.
    let tuned = tune_malloc && rankwise::cpu::alloc::tune_allocator();
    // As `rankwise train` runs on a machine of at most two cores: candle's element-wise ops on
    // the calling thread, so that its pool's spinning worker does not hold a core
    // (`rankwise::cpu::threads`; `RANKWISE_NO_THREAD_TUNING=1` leaves candle's default).
    let threads = rankwise::cpu::threads::tune_candle_threads();
    if losses.is_empty() {
        losses = LOSSES.iter().map(|s| s.to_string()).collect();
    }
    if batches.is_empty() {
        batches = BATCHES.to_vec();
    }
    for b in &batches {
        for name in &losses {
            bench(name, *b, reps, tuned, threads)?;
        }
    }
    Ok(())
}

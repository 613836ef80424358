//! Training throughput (images/s for forward + backward + optimizer step) of the embedding
//! networks on random images, with a simple contrastive loss.
//!
//! ```text
//! cargo run --example train_throughput -- --model small --size 32 --batch 64 --steps 20
//! cargo run --example train_throughput -- --model resnet18 --size 224 --batch 64 --steps 3
//! RAYON_NUM_THREADS=2 cargo run --release --example train_throughput -- --model resnet50 --size 224 --steps 3
//! ```
//!
//! The dev profile already compiles candle (where the time goes) at `opt-level = 3`. The glibc
//! allocator is tuned first ([`rankwise::cpu::alloc::tune_allocator`], as `rankwise train` does)
//! unless `--no-malloc-tuning` is given, and candle's thread pools are set as `rankwise train`
//! sets them ([`rankwise::cpu::threads::tune_candle_threads`]; `RANKWISE_NO_THREAD_TUNING=1`
//! leaves candle's default). The PyTorch counterpart is
//! `benches/train_throughput_vs_torch.py`; results in `benches/train_throughput_vs_torch.md`.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use rankwise::hierarchy::Labels;
use rankwise::losses::RankLoss;
use rankwise::models::{
    BackboneConfig, EmbeddingHeadConfig, EmbeddingNet, EmbeddingNetConfig, ParamStore,
    ResNetConfig, ResNetDepth, SmallCnnConfig, BACKBONE_PREFIX, HEAD_PREFIX,
};
use rankwise::train::large_batch::direct_gradients;
use rankwise::train::{AdamConfig, Algorithm, Optimizer, ParamGroup};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// `small`, `resnet18`, `resnet34` or `resnet50`.
    #[arg(long, default_value = "small")]
    model: String,
    /// Image side.
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Timed steps (after one warm-up step).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Small CNN stage widths, comma-separated.
    #[arg(long, default_value = "32,64,128,256")]
    widths: String,
    /// Small CNN blocks per stage.
    #[arg(long, default_value_t = 1)]
    convs_per_stage: usize,
    /// Freeze BatchNorm.
    #[arg(long)]
    frozen_bn: bool,
    /// Keep glibc's default allocator settings (to measure what the tuning gives).
    #[arg(long)]
    no_malloc_tuning: bool,
}

/// Mean squared distance of positive pairs minus that of negative pairs (just a differentiable
/// batch-coupled loss for timing).
struct Contrastive;

impl RankLoss for Contrastive {
    fn forward(&self, e: &Tensor, labels: &Labels) -> rankwise::Result<Tensor> {
        let b = labels.len();
        let same: Vec<f32> = (0..b * b)
            .map(|k| {
                if labels.fine(k / b) == labels.fine(k % b) {
                    1.0
                } else {
                    -1.0
                }
            })
            .collect();
        let sign = Tensor::from_vec(same, (b, b), e.device())?;
        let sim = e.matmul(&e.t()?)?;
        Ok(((sim * sign)?.mean_all()? * -1.0)?)
    }
}

// As the `rankwise` binary: large buffers kept for the next step once the allocator is tuned
// (`--no-malloc-tuning` leaves both off).
#[global_allocator]
static ALLOCATOR: rankwise::cpu::alloc::LargeBlockCache = rankwise::cpu::alloc::LargeBlockCache;

fn main() -> Result<()> {
    let args = Args::parse();
    let threads = rankwise::cpu::threads::tune_candle_threads();
    let tuned = !args.no_malloc_tuning && rankwise::cpu::alloc::tune_allocator();
    let backbone = match args.model.as_str() {
        "small" => BackboneConfig::SmallCnn(SmallCnnConfig {
            widths: args
                .widths
                .split(',')
                .map(|w| w.trim().parse())
                .collect::<std::result::Result<_, _>>()?,
            convs_per_stage: args.convs_per_stage,
            frozen_bn: args.frozen_bn,
            ..SmallCnnConfig::default()
        }),
        name => BackboneConfig::Resnet(ResNetConfig::new(
            match name {
                "resnet18" => ResNetDepth::Resnet18,
                "resnet34" => ResNetDepth::Resnet34,
                "resnet50" => ResNetDepth::Resnet50,
                other => anyhow::bail!("unknown model {other}"),
            },
            args.frozen_bn,
        )),
    };
    let config = EmbeddingNetConfig {
        backbone,
        head: EmbeddingHeadConfig::default(),
    };
    let device = Device::Cpu;
    let params = ParamStore::new(0);
    let model = EmbeddingNet::new(&config, params.var_builder(DType::F32, &device))?;
    let adam = Algorithm::Adam(AdamConfig::default());
    let mut opt = Optimizer::new(vec![
        ParamGroup {
            name: "backbone".into(),
            algorithm: adam,
            lr: 1e-4,
            params: params.trainable(BACKBONE_PREFIX),
        },
        ParamGroup {
            name: "head".into(),
            algorithm: adam,
            lr: 1e-4,
            params: params.trainable(HEAD_PREFIX),
        },
    ])?;
    // Seeded, so that two builds can be checked to compute the same losses bit for bit.
    let values: Vec<f32> = {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let normal = rand_distr::StandardNormal;
        (0..args.batch * 3 * args.size * args.size)
            .map(|_| rand::Rng::sample(&mut rng, normal))
            .collect()
    };
    let x = Tensor::from_vec(values, (args.batch, 3, args.size, args.size), &device)?;
    let labels = Labels::from_fine(&(0..args.batch).map(|i| (i / 4) as i64).collect::<Vec<_>>())?;
    let forward = |x: &Tensor| model.forward_t(x, true);
    let mut step = || -> Result<f64> {
        let (loss, grads) = direct_gradients(&forward, &x, &labels, &Contrastive)?;
        opt.step(&grads)?;
        Ok(loss)
    };
    step()?;
    let start = Instant::now();
    let mut loss = 0.0;
    for _ in 0..args.steps {
        loss = step()?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} {}x{} batch {}: {:.1} images/s ({:.3} s/step, {} trainable parameters, {} rayon threads, malloc tuning {}, candle threads {:?}, last loss {:e})",
        args.model,
        args.size,
        args.size,
        args.batch,
        (args.steps * args.batch) as f64 / secs,
        secs / args.steps as f64,
        params.num_trainable(""),
        rayon::current_num_threads(),
        if tuned { "on" } else { "off" },
        threads,
        loss
    );
    Ok(())
}

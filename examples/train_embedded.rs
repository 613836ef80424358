//! Trains the small CNN on the embedded dataset and reports R@1 on the class-disjoint test split
//! before and after training. `--loss` picks a simple contrastive loss written here, or the
//! library's Smooth-AP or HAPPIER H-AP loss (any `RankLoss` plugs in the same way).
//!
//! ```text
//! cargo run --release --example train_embedded -- --epochs 3 --out runs/contrastive
//! cargo run --release --example train_embedded -- --epochs 3 --loss smooth-ap
//! ```
//!
//! Writes `metrics.csv`, `metrics.parquet` and `checkpoint.safetensors` to `--out` if given;
//! `--resume <checkpoint>` continues a run.

use anyhow::Result;
use candle_core::Tensor;
use clap::Parser;
use rankwise::hierarchy::Labels;
use rankwise::losses::happier::HapLoss;
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::losses::{check_batch, RankLoss};
use rankwise::models::{BackboneConfig, SmallCnnConfig};
use rankwise::train::{DeviceChoice, TrainConfig, Trainer};

#[derive(Parser)]
struct Args {
    /// Epochs.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Small CNN stage widths, comma-separated.
    #[arg(long, default_value = "32,64,128,256")]
    widths: String,
    /// Images per fine class of the embedded dataset.
    #[arg(long, default_value_t = 30)]
    images_per_class: usize,
    /// Seed of the weights and the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `contrastive`, `smooth-ap` (paper defaults, τ = 0.01) or `hap` (HAPPIER's H-AP loss,
    /// paper defaults, without the clustering term, whose proxies need their own optimizer).
    #[arg(long, default_value = "contrastive")]
    loss: String,
    /// Margin of the contrastive loss on cosine similarities.
    #[arg(long, default_value_t = 0.5)]
    margin: f64,
    /// `cpu`, `cuda` or `auto`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Output folder.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Resume from this checkpoint.
    #[arg(long)]
    resume: Option<std::path::PathBuf>,
    /// Print the configuration as a TOML recipe and exit.
    #[arg(long)]
    print_config: bool,
    /// Read the configuration from this TOML recipe (see `configs/`); `--out`, `--resume` and
    /// `--loss` still apply.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

/// Contrastive loss on cosine similarities (Hadsell et al., 2006): the mean over ordered pairs
/// `i ≠ j` of `1 − s_ij` for positives (same fine class) and `max(0, s_ij − margin)` for
/// negatives.
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
            let v: Vec<f32> = (0..b * b)
                .map(|k| {
                    let (i, j) = (k / b, k % b);
                    f32::from(u8::from(
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

fn main() -> Result<()> {
    let args = Args::parse();
    let mut config = TrainConfig {
        seed: args.seed,
        epochs: args.epochs,
        device: DeviceChoice::parse(&args.device)?,
        resume: args.resume.clone(),
        ..TrainConfig::default()
    };
    if let Some(data) = config.dataset.embedded_mut() {
        data.images_per_class = args.images_per_class;
    }
    config.model.backbone = BackboneConfig::SmallCnn(SmallCnnConfig {
        widths: args
            .widths
            .split(',')
            .map(|w| w.trim().parse())
            .collect::<std::result::Result<_, _>>()?,
        ..SmallCnnConfig::default()
    });
    if let Some(path) = &args.config {
        config = TrainConfig::from_toml_file(path)?;
        config.resume = args.resume.clone();
    }
    config.output.dir = args.out;
    if args.print_config {
        print!("{}", config.to_toml_string()?);
        return Ok(());
    }
    let loss: Box<dyn RankLoss> = match args.loss.as_str() {
        "contrastive" => Box::new(Contrastive {
            margin: args.margin,
        }),
        "smooth-ap" => Box::new(SmoothAp::default()),
        "hap" => Box::new(HapLoss::default()),
        other => anyhow::bail!("unknown --loss '{other}': use contrastive, smooth-ap or hap"),
    };
    let mut trainer = Trainer::new(config, loss.as_ref())?;
    println!(
        "{} training / {} test images, {} trainable parameters, {} rayon threads",
        trainer.train_set().len(),
        trainer.test_set().len(),
        trainer.params().num_trainable(""),
        rayon::current_num_threads()
    );
    let report = trainer.fit()?;
    for e in &report.epochs {
        println!(
            "epoch {}: mean loss {:.4}, {:.1} images/s (forward + backward + step), {} batches",
            e.epoch, e.mean_loss, e.images_per_s, e.batches
        );
    }
    println!("epoch  R@1(fine)  R@1(variant)  R@1(family)  mAP@R(fine)  H-AP");
    let series = |metric: &str, level: Option<usize>| report.log.series("test", metric, level);
    let r1 = series("R@1", Some(0));
    for (k, (epoch, v)) in r1.iter().enumerate() {
        println!(
            "{epoch:5}  {:9.4}  {:12.4}  {:11.4}  {:11.4}  {:.4}",
            v,
            series("R@1", Some(1))[k].1,
            series("R@1", Some(2))[k].1,
            series("mAP@R", Some(0))[k].1,
            series("H-AP", None)[k].1
        );
    }
    Ok(())
}

//! Transductive few-shot classification at quick scale (SSR Table 2's protocol on the embedded
//! shapes dataset): the small CNN trained on the base classes (64% of the 256 fine classes) and
//! frozen, 5-way 1-shot and 5-shot episodes with 15 queries per class from the novel classes
//! (20%), accuracy ± 95% interval over `--episodes` episodes, for a randomly initialised and a
//! trained backbone.
//!
//! ```text
//! cargo run --release --example fewshot_quick -- --epochs 5 --episodes 2000 --out runs/fewshot.csv
//! cargo run --release --example fewshot_quick -- --grid   # also SSR's k-reciprocal grid
//! ```

use anyhow::Result;
use clap::Parser;
use rankwise::fewshot::prototype::{PrototypeClassifier, PrototypeMetric};
use rankwise::fewshot::soft_kmeans::SoftKMeansClassifier;
use rankwise::fewshot::{
    evaluate, quick_backbone_features, EpisodeClassifier, QuickBackboneConfig,
};
use rankwise::io::atomic::write_atomically;
use rankwise::losses::contrastive::Contrastive;
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::losses::RankLoss;
use rankwise::rerank::k_reciprocal::{best_of_grid, ssr_fewshot_grid, KReciprocalClassifier};
use rankwise::samplers::episodes::EpisodeConfig;
use std::io::Write;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Training epochs of the backbone on the base classes.
    #[arg(long, default_value_t = 5)]
    epochs: u64,
    /// Test episodes per setting (SSR: 2000).
    #[arg(long, default_value_t = 2000)]
    episodes: usize,
    /// Seed of the weights, the sampler and the episodes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `smooth-ap` (paper defaults) or `contrastive` (ROADMAP's margins).
    #[arg(long, default_value = "smooth-ap")]
    loss: String,
    /// Also evaluate SSR's 27-point k-reciprocal grid and report the best point (selected on
    /// the test episodes, as SSR's script does).
    #[arg(long)]
    grid: bool,
    /// Write the table as CSV here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let loss: Box<dyn RankLoss> = match args.loss.as_str() {
        "smooth-ap" => Box::new(SmoothAp::default()),
        "contrastive" => Box::new(Contrastive::default()),
        other => anyhow::bail!("unknown --loss '{other}'"),
    };
    let mut rows: Vec<(String, String, String, f64, f64)> = Vec::new();
    for trained in [false, true] {
        let mut config = QuickBackboneConfig::default();
        config.train.seed = args.seed;
        config.train.epochs = args.epochs;
        config.train.eval.every = 0;
        config.train.eval.at_start = false;
        config.train_backbone = trained;
        let start = Instant::now();
        let backbone = quick_backbone_features(&config, loss.as_ref())?;
        let name = if trained {
            format!("small CNN, {} epochs {}", args.epochs, args.loss)
        } else {
            "small CNN, random init".to_string()
        };
        println!(
            "{name}: {} novel images of {} classes ({} base classes), {:.1} s",
            backbone.labels.len(),
            backbone.novel_classes.len(),
            backbone.base_classes.len(),
            start.elapsed().as_secs_f64()
        );
        for shots in [1, 5] {
            let episodes = EpisodeConfig {
                shots,
                ..EpisodeConfig::default()
            };
            let classifiers: Vec<(&str, Box<dyn EpisodeClassifier + Sync>)> = vec![
                (
                    "prototype (cosine)",
                    Box::new(PrototypeClassifier::default()),
                ),
                (
                    "prototype (Euclidean)",
                    Box::new(PrototypeClassifier {
                        metric: PrototypeMetric::SquaredEuclidean,
                    }),
                ),
                (
                    "soft k-means (1 step)",
                    Box::new(SoftKMeansClassifier::default()),
                ),
                (
                    "k-reciprocal (20, 6, 0.3)",
                    Box::new(KReciprocalClassifier::default()),
                ),
            ];
            for (method, c) in &classifiers {
                let t = Instant::now();
                let acc = evaluate(
                    c.as_ref(),
                    &backbone.features,
                    &backbone.labels,
                    &episodes,
                    args.episodes,
                    args.seed,
                )?;
                println!(
                    "  5-way {shots}-shot  {method:28} {:6.2} ± {:.2}  ({:.1} s)",
                    acc.mean,
                    acc.half_width,
                    t.elapsed().as_secs_f64()
                );
                rows.push((
                    name.clone(),
                    format!("5-way {shots}-shot"),
                    method.to_string(),
                    acc.mean,
                    acc.half_width,
                ));
            }
            if args.grid {
                let (results, best) = best_of_grid(
                    &ssr_fewshot_grid(),
                    &backbone.features,
                    &backbone.labels,
                    &episodes,
                    args.episodes,
                    args.seed,
                )?;
                let (p, acc) = results[best];
                let method = format!(
                    "k-reciprocal best of grid ({}, {}, {})",
                    p.k1, p.k2, p.lambda
                );
                println!(
                    "  5-way {shots}-shot  {method:28} {:6.2} ± {:.2}",
                    acc.mean, acc.half_width
                );
                rows.push((
                    name.clone(),
                    format!("5-way {shots}-shot"),
                    method,
                    acc.mean,
                    acc.half_width,
                ));
            }
        }
    }
    if let Some(path) = &args.out {
        write_atomically(path, |w: &mut dyn Write| {
            writeln!(w, "backbone,setting,method,accuracy,ci95")?;
            for (b, s, m, a, h) in &rows {
                writeln!(w, "\"{b}\",{s},\"{m}\",{a},{h}")?;
            }
            Ok(())
        })?;
    }
    Ok(())
}
